"""The compiled steps: a training step (forward, backward, all-reduce, update, and the
step-timing rows it carries) and an evaluation step, which the workers' loop and the
sidecar evaluator share.

A training step is all or nothing on every rank that lives through a peer's failure. It
runs as two functions: the first holds every collective of the step (the gradients'
all-reduce and the sum of its outputs) and changes no variable; the second applies the
summed gradients and counts the step (``counter``, the checkpoint's step) on this
worker alone, so no peer's failure can cut it short. A survivor's variables therefore
hold the step its ``counter`` says (slurmtf.training.rescue). What the forward pass
itself changes (dropout's random state) is kept at each step's start and put back when
the step was not applied (:meth:`Steps.roll_back`).

Every step is traced without AutoGraph (:func:`_compiled`): their control flow is
Python's, decided at tracing, and AutoGraph's rewrite of these functions took most of
the tracing of a start's first step, which every restart pays (synthetic MNIST,
TensorFlow 2.21, an idle 2-core machine: 0.95 s traced with it, 0.2 s without). The
model's own layers are converted or not as Keras decides, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from slurmtf.tf import compat
from slurmtf.training import grad_reduce
from slurmtf.training.grad_reduce import GradReduce


class Steps:
    """The compiled train and eval steps for one strategy, model and optimizer."""

    def __init__(
        self,
        strategy: Any,
        model: Any,
        optimizer: Any,
        global_batch: int,
        xla: bool,
        *,
        reduce: GradReduce | None = None,
        extra_columns: int = 0,
        counter: Any = None,
        guarded: Sequence[Any] = (),
    ) -> None:
        """``extra_columns``: the figures each step carries after this rank's last step time
        (its GPUs, its link rates: slurmtf.training.steptiming);
        ``counter``: an int64 variable the step adds one to once it is applied;
        ``guarded``: variables the forward pass changes before the gradients are summed
        (dropout's random state): each step keeps their values first (:meth:`roll_back`)."""
        import tensorflow as tf

        reduce = reduce or GradReduce()
        grad_reduce.take_over_reduction(optimizer, reduce)
        self._guarded = list(guarded)
        self._kept = [_local_copy(v) for v in self._guarded]
        self._strategy = strategy
        self._model = model
        forward_backward = _forward_backward(model, optimizer, global_batch)
        compiled = _compiled(forward_backward, jit_compile=True) if xla else forward_backward
        sum_replica = _summing_replica(
            compiled, reduce, int(strategy.num_replicas_in_sync), global_batch
        )

        def gather(iterator: Any, flag: Any, extra: Any) -> Any:
            """Every collective of a step; it changes nothing but the guarded variables."""
            for kept, variable in zip(self._kept, self._guarded, strict=True):
                kept.assign(compat.variable_value(variable))  # read before the forward pass
            started = tf.timestamp()
            with tf.control_dependencies([started]):
                images, labels = next(iterator)
            summed, total = strategy.run(sum_replica, args=(images, labels, flag, started, extra))
            return summed, strategy.experimental_local_results(total)[0]

        apply = _applying(strategy, model, optimizer, counter)
        compiled_gather, compiled_apply = _compiled(gather), _compiled(apply)
        no_extra = tf.zeros([1 + extra_columns])

        def train(iterator: Any, flag: Any, extra: Any = None) -> Any:
            """``[loss, accuracy, flag, rows...]`` summed over replicas; ``extra``: this
            rank's last step time, GPUs and link rates (slurmtf.training.steptiming)."""
            summed, out = compiled_gather(iterator, flag, no_extra if extra is None else extra)
            compiled_apply(summed)
            return out

        self.train_step = train
        self.eval_step = make_eval_step(strategy, model)

    def roll_back(self) -> None:
        """Put the guarded variables back as the last step began (eagerly, this worker's
        copies): for a step that a peer's failure broke before it was applied."""
        for kept, variable in zip(self._kept, self._guarded, strict=True):
            variable.assign(compat.variable_value(kept))

    def state_sync(self) -> Callable[[], None]:
        """A function that averages the model's float non-trainable variables over replicas.

        One all-reduce of the moving statistics, run at evaluations and checkpoints only.
        """
        import tensorflow as tf

        strategy = self._strategy
        state = [v for v in self._model.non_trainable_variables if "float" in str(v.dtype)]
        if not state or strategy.num_replicas_in_sync == 1:
            return no_state_sync

        def replica_values() -> Any:
            return _flat(state, tf.float32)

        def sync() -> None:
            flat = strategy.reduce(
                tf.distribute.ReduceOp.MEAN, strategy.run(replica_values), axis=None
            )
            _assign_flat(state, flat)

        compiled = _compiled(sync)

        def run() -> None:
            compiled()

        return run

    def check_same_step(self, step: int, *, needs_sync: bool = False) -> bool:
        """Fail clearly when ranks resumed from different checkpoints (unshared
        --model_dir); True when a rank ``needs_sync`` (:meth:`sync_from_chief`), so that
        every rank learns it from the same collective."""
        import tensorflow as tf

        value = tf.constant(
            [float(step), float(step) ** 2, 1.0, float(needs_sync)], dtype=tf.float64
        )
        strategy = self._strategy

        def total() -> Any:
            per_replica = strategy.run(lambda: tf.identity(value))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        out = _compiled(total)().numpy()
        mean = out[0] / out[2]
        if abs(out[1] / out[2] - mean * mean) > 1e-6:
            from slurmtf.errors import InputError

            raise InputError(
                "--model_dir",
                "(per rank)",
                f"ranks resumed at different steps (this one at {step})",
                "put --model_dir on a file system every node shares",
            )
        return bool(out[3] > 0)

    def sync_from_chief(self, variables: Sequence[Any]) -> None:
        """Give ``variables`` the chief's values (its first replica's) on every replica,
        in one all-reduce per wire dtype: for variables created without the broadcast of
        their initial values (slurmtf.tf.collectives.local_initial_values)."""
        import tensorflow as tf

        strategy = self._strategy
        groups: dict[Any, list[Any]] = {}
        for variable in variables:
            groups.setdefault(_wire_dtype(variable.dtype), []).append(variable)

        def replica_values() -> Any:
            context = tf.distribute.get_replica_context()
            first = context.replica_id_in_sync_group == 0
            summed = []
            for wire, members in groups.items():  # one all-reduce per dtype: it packs them
                flat = _flat(members, wire)
                own = tf.where(first, flat, tf.zeros_like(flat))  # where, not * 0: no NaN
                summed.append(context.all_reduce("sum", own))
            return summed

        def sync() -> None:
            out = strategy.run(replica_values)
            summed = [strategy.experimental_local_results(x)[0] for x in out]
            for flat, members in zip(summed, groups.values(), strict=True):
                _assign_flat(members, flat)

        if groups:
            _compiled(sync)()


def make_eval_step(strategy: Any, model: Any) -> Any:
    """The compiled evaluation step: ``[summed loss, correct, examples]`` of one batch per
    replica, summed over the replicas."""
    import tensorflow as tf

    eval_replica = _eval_replica(model)

    def eval_step(iterator: Any) -> Any:
        images, labels = next(iterator)
        out = strategy.run(eval_replica, args=(images, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, out, axis=None)

    return _compiled(eval_step)


def _compiled(function: Callable[..., Any], **options: Any) -> Any:
    """``function`` as a ``tf.function`` traced without AutoGraph (the module's docstring)."""
    import tensorflow as tf

    return tf.function(function, autograph=False, **options)


def no_state_sync() -> None:
    """No replica-local state to average."""


def _forward_backward(model: Any, optimizer: Any, global_batch: int) -> Callable[..., Any]:
    """One replica's loss (averaged over the GLOBAL batch), correct count and gradients."""
    import keras
    import tensorflow as tf

    def forward_backward(images: Any, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            logits = tf.cast(model(images, training=True), tf.float32)
            per_example = keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True
            )
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            if model.losses:
                reg = tf.add_n([tf.cast(x, tf.float32) for x in model.losses])
                loss += tf.nn.scale_regularization_loss(reg)
            scaled = compat.scale_loss(optimizer, loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        grads = compat.unscale_gradients(optimizer, grads)
        return loss, _correct(labels, logits), grads

    return forward_backward


def _eval_replica(model: Any) -> Callable[..., Any]:
    """One replica's summed loss, correct count and example count on a batch."""
    import keras
    import tensorflow as tf

    def eval_replica(images: Any, labels: Any) -> Any:
        logits = tf.cast(model(images, training=False), tf.float32)
        per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        count = tf.cast(tf.shape(labels)[0], tf.float32)
        return tf.stack([tf.reduce_sum(per_example), _correct(labels, logits), count])

    return eval_replica


def _summing_replica(
    compiled: Callable[..., Any], reduce: GradReduce, replicas: int, global_batch: int
) -> Callable[..., Any]:
    """One replica's part of a step's collectives: its gradients and outputs, summed."""
    import tensorflow as tf

    def sum_replica(images: Any, labels: Any, flag: Any, started: Any, extra: Any) -> Any:
        loss, correct, grads = compiled(images, labels)
        with tf.control_dependencies([loss, *_tensors(grads)]):
            computed = tf.timestamp()
        # steptiming: this replica's row, [compute, its last step's time, link rates]
        row = tf.concat([tf.cast([computed - started], tf.float32), extra], 0)
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        rows = tf.one_hot(replica, replicas)[:, None] * row[None, :]
        head = tf.stack([loss, correct / global_batch, flag])
        out = tf.concat([head, tf.reshape(rows, [-1])], 0)
        total = tf.distribute.get_replica_context().all_reduce("sum", out)
        return grad_reduce.all_reduce(grads, reduce), total  # here, not inside Keras

    return sum_replica


def _applying(strategy: Any, model: Any, optimizer: Any, counter: Any) -> Callable[[Any], None]:
    """The update of a step from its summed gradients, then its count."""

    def apply_replica(summed: Any) -> None:
        pairs = zip(summed, model.trainable_variables, strict=True)
        compat.apply_gradients(optimizer, pairs, summed=True)

    def apply(summed: Any) -> None:
        """On this worker alone: no peer's failure can cut it short."""
        strategy.run(apply_replica, args=(summed,))
        if counter is not None:
            counter.assign_add(1)

    return apply


def _flat(variables: Sequence[Any], dtype: Any) -> Any:
    """The values of ``variables`` in one vector of ``dtype``, in their order."""
    import tensorflow as tf

    values = [compat.variable_value(v) for v in variables]
    return tf.concat([tf.reshape(tf.cast(v, dtype), [-1]) for v in values], 0)


def _assign_flat(variables: Sequence[Any], flat: Any) -> None:
    """Give ``variables`` their parts of ``flat`` (:func:`_flat`'s layout)."""
    import numpy as np
    import tensorflow as tf

    sizes = [int(np.prod(v.shape)) for v in variables]
    for variable, part in zip(variables, tf.split(flat, sizes), strict=True):
        variable.assign(tf.cast(tf.reshape(part, variable.shape), variable.dtype))


def _wire_dtype(dtype: Any) -> Any:
    """The dtype a variable's values cross an all-reduce in without loss."""
    import tensorflow as tf

    dtype = tf.as_dtype(dtype)  # Keras 3 names it by a string
    if dtype.is_floating:
        return tf.float64 if dtype == tf.float64 else tf.float32
    return tf.int64


def _local_copy(variable: Any) -> Any:
    """A plain variable on the device of ``variable``'s copy on this worker: no broadcast
    at its creation, no replica copies."""
    import tensorflow as tf

    value = tf.convert_to_tensor(compat.variable_value(variable))
    with tf.device(value.device):
        return tf.Variable(value, trainable=False)


def _tensors(values: Any) -> list[Any]:
    """The tensors of a gradient list (``None`` left out, ``IndexedSlices`` by values)."""
    return [getattr(v, "values", v) for v in values if v is not None]


def _correct(labels: Any, logits: Any) -> Any:
    import tensorflow as tf

    predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
    return tf.reduce_sum(tf.cast(tf.equal(predictions, tf.cast(labels, tf.int32)), tf.float32))
