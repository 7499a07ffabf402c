"""The compiled steps: a training step (forward, backward, all-reduce, update, and the
step-timing rows it carries) and an evaluation step, which the workers' loop and the
sidecar evaluator share.

A training step is all or nothing on every rank that lives through a peer's failure:
no variable changes before every gradient is summed, and the step's last collective
(the reduce of its outputs) and its count (``counter``, the checkpoint's step) wait
until every variable has changed. A survivor's variables therefore hold the step its
``counter`` says, whichever collective the failure broke (slurmtf.training.rescue); what
the forward pass itself changes (dropout's random state) is kept at each step's start
and put back when the step was not applied (:meth:`Steps.roll_back`).
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
        link_columns: int = 0,
        counter: Any = None,
        guarded: Sequence[Any] = (),
    ) -> None:
        """``link_columns``: the link rates each step carries (slurmtf.training.steptiming);
        ``counter``: an int64 variable the step adds one to once it is applied;
        ``guarded``: variables the forward pass changes before the gradients are summed
        (dropout's random state): each step keeps their values first (:meth:`roll_back`)."""
        import tensorflow as tf

        reduce = reduce or GradReduce()
        grad_reduce.take_over_reduction(optimizer, reduce)
        state = [*model.trainable_variables, *compat.optimizer_variables(optimizer)]
        self._guarded = list(guarded)
        with tf.device("/cpu:0"):  # this worker's own: no broadcast, no replica copies
            self._kept = [
                tf.Variable(compat.variable_value(v), trainable=False) for v in self._guarded
            ]
        self._strategy = strategy
        self._model = model
        forward_backward = _forward_backward(model, optimizer, global_batch)
        compiled = tf.function(forward_backward, jit_compile=True) if xla else forward_backward

        replicas = int(strategy.num_replicas_in_sync)

        def train_replica(images: Any, labels: Any, flag: Any, started: Any, extra: Any) -> Any:
            loss, correct, grads = compiled(images, labels)
            with tf.control_dependencies([loss, *_tensors(grads)]):
                computed = tf.timestamp()
            summed = grad_reduce.all_reduce(grads, reduce)  # here, not inside Keras
            with tf.control_dependencies(_tensors(summed)):  # every sum before any update
                summed = [tf.identity(g) for g in summed]
            pairs = zip(summed, model.trainable_variables, strict=True)
            compat.apply_gradients(optimizer, pairs, summed=True)
            # Reads order after the updates of their variable: the outputs wait for all.
            reads = [tf.identity(compat.variable_value(v)) for v in state]
            with tf.control_dependencies(reads):
                # steptiming: this replica's row, [compute, its last step's time, link rates]
                row = tf.concat([tf.cast([computed - started], tf.float32), extra], 0)
                replica = tf.distribute.get_replica_context().replica_id_in_sync_group
                rows = tf.one_hot(replica, replicas)[:, None] * row[None, :]
                head = tf.stack([loss, correct / global_batch, flag])
                return tf.concat([head, tf.reshape(rows, [-1])], 0)

        def train_step(iterator: Any, flag: Any, extra: Any) -> Any:
            for kept, variable in zip(self._kept, self._guarded, strict=True):
                kept.assign(compat.variable_value(variable))  # read before the forward pass
            started = tf.timestamp()
            with tf.control_dependencies([started]):
                images, labels = next(iterator)
            out = strategy.run(train_replica, args=(images, labels, flag, started, extra))
            if counter is None:
                return strategy.reduce(tf.distribute.ReduceOp.SUM, out, axis=None)
            with tf.control_dependencies(strategy.experimental_local_results(out)):
                count = counter.assign_add(1)  # this worker's copies, no collective
            # The count rides in the reduced outputs, so the reduce cannot start before it.
            out = strategy.run(_with_count, args=(out, count))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, out, axis=None)[:-1]

        compiled_step = tf.function(train_step)
        no_extra = tf.zeros([1 + link_columns])

        def train(iterator: Any, flag: Any, extra: Any = None) -> Any:
            """``[loss, accuracy, flag, rows...]`` summed over replicas; ``extra``: this
            rank's last step time and link rates (slurmtf.training.steptiming)."""
            return compiled_step(iterator, flag, no_extra if extra is None else extra)

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
        import numpy as np
        import tensorflow as tf

        strategy = self._strategy
        state = [v for v in self._model.non_trainable_variables if "float" in str(v.dtype)]
        if not state or strategy.num_replicas_in_sync == 1:
            return no_state_sync

        sizes = [int(np.prod(v.shape)) for v in state]

        def replica_values() -> Any:
            values = [compat.variable_value(v) for v in state]
            return tf.concat([tf.reshape(tf.cast(v, tf.float32), [-1]) for v in values], 0)

        def sync() -> None:
            flat = strategy.reduce(
                tf.distribute.ReduceOp.MEAN, strategy.run(replica_values), axis=None
            )
            for variable, mean in zip(state, tf.split(flat, sizes), strict=True):
                variable.assign(tf.cast(tf.reshape(mean, variable.shape), variable.dtype))

        compiled = tf.function(sync)

        def run() -> None:
            compiled()

        return run

    def check_same_step(self, step: int) -> None:
        """Fail clearly when ranks resumed from different checkpoints (unshared --model_dir)."""
        import tensorflow as tf

        value = tf.constant([float(step), float(step) ** 2, 1.0], dtype=tf.float64)
        strategy = self._strategy

        def total() -> Any:
            per_replica = strategy.run(lambda: tf.identity(value))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        out = tf.function(total)().numpy()
        mean = out[0] / out[2]
        if abs(out[1] / out[2] - mean * mean) > 1e-6:
            from slurmtf.errors import InputError

            raise InputError(
                "--model_dir",
                "(per rank)",
                f"ranks resumed at different steps (this one at {step})",
                "put --model_dir on a file system every node shares",
            )


def make_eval_step(strategy: Any, model: Any) -> Any:
    """The compiled evaluation step: ``[summed loss, correct, examples]`` of one batch per
    replica, summed over the replicas."""
    import tensorflow as tf

    eval_replica = _eval_replica(model)

    def eval_step(iterator: Any) -> Any:
        images, labels = next(iterator)
        out = strategy.run(eval_replica, args=(images, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, out, axis=None)

    return tf.function(eval_step)


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


def _with_count(out: Any, count: Any) -> Any:
    """A replica's outputs with the step count appended (see ``train_step``)."""
    import tensorflow as tf

    return tf.concat([out, tf.cast(tf.reshape(count, [1]), out.dtype)], 0)


def _tensors(values: Any) -> list[Any]:
    """The tensors of a gradient list (``None`` left out, ``IndexedSlices`` by values)."""
    return [getattr(v, "values", v) for v in values if v is not None]


def _correct(labels: Any, logits: Any) -> Any:
    import tensorflow as tf

    predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
    return tf.reduce_sum(tf.cast(tf.equal(predictions, tf.cast(labels, tf.int32)), tf.float32))
