"""Keras 3 under ``tf.distribute`` where an older Keras release gets it wrong.

Found by running the bundled models and users' ``model.fit`` scripts on each tested
TensorFlow release with the Keras of its time (docs/TENSORFLOW_VERSIONS.md). Each fix is
applied only where its feature says the release needs it, never by version string:

1. **Seed state** (Keras 3.3): a random layer's ``SeedGenerator`` (Dropout's) keeps its
   state in a ``uint32`` variable, and MultiWorkerMirroredStrategy broadcasts every new
   variable's initial value with a collective that takes no ``uint32`` ("Value for attr
   'T' of uint32 is not in the list of allowed values"). Keras 3.4 and later keep it
   ``int64`` for TensorFlow (``backend.random_seed_dtype``); so does this fix.
2. **Gradient sum** (Keras 3.3): the TensorFlow optimizer sums the replicas' gradients
   inside its cross-replica ``merge_call``, where there is no replica context, so it sums
   nothing: each replica applies its own gradient and the replicas drift apart
   (MirroredStrategy and MultiWorkerMirroredStrategy alike). Keras 3.4 and later sum
   them before the merge; so does this fix.

3. **Loss per replica** (Keras 3.3 to 3.5): ``model.fit``'s ``train_step`` neither divides
   the loss by the replicas in sync nor averages their gradients, so the optimizer applies
   their sum: with 2 workers each step goes twice as far as with one (and ``fit`` on N
   replicas trains at N times the learning rate; keras-team/keras#19891). Keras 3.6 and
   later scale each replica's loss by ``1 / replicas`` (``losses.loss
   .scale_loss_for_distribution``); this fix divides the gradients of ``fit``'s own
   ``train_step`` (and of a ``train_step`` that calls it) by the replicas before the
   optimizer applies them: the same update. A custom ``train_step`` that computes its own
   gradients gets what that Keras gives it.
4. **Metrics per replica** (Keras 3.3 to 3.9): a metric's variables (its total and
   count) are plain variables, each replica adds to its own copy and ``fit`` and
   ``evaluate`` report one replica's share of the batch, not the global result
   (keras-team/keras#21054): the history of 2 workers differs from one worker's though
   the weights agree. Keras 3.10 and later create them synchronised on read, so that
   reading them outside the replicas sums the copies (``Variable.synchronization``);
   so does this fix, for the variables a metric adds while a strategy is in use.

:func:`fix_older_keras` applies them (idempotent); the training loop calls it before it
builds a model under a strategy, ``slurmtf.tf.keras_compat.enable_multiworker_fit`` for
users' ``model.fit``. Imports Keras and TensorFlow.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from slurmtf.tf import compat

# The functions that handle a release difference (docs/TENSORFLOW_VERSIONS.md's table).
RELEASE_DIFFERENCES = ("fix_older_keras", "sums_in_merge")

REDUCTION = compat.GRADIENT_SUM
_MARK = "_slurmtf_fixed"
_IN_FIT = threading.local()  # .replicas: set while fit's train_step is traced


def fix_older_keras() -> list[str]:
    """Apply the fixes this Keras 3 needs; the names of those applied (none: Keras 2, or a
    release that needs none)."""
    import keras

    if not compat.is_keras_3(keras):
        return []
    from keras.src import backend
    from keras.src.backend.common import variables as common_variables
    from keras.src.backend.tensorflow import core as tf_core
    from keras.src.backend.tensorflow import optimizer
    from keras.src.backend.tensorflow import trainer as tf_trainer
    from keras.src.losses import loss as loss_module
    from keras.src.metrics import metric
    from keras.src.optimizers import base_optimizer
    from keras.src.random import seed_generator

    applied = []
    if not hasattr(backend, "random_seed_dtype"):
        _replace(seed_generator.SeedGenerator, "__init__", _seed_generator_init)
        applied.append("seed state")
    if sums_in_merge(optimizer.TFOptimizer):
        _replace(optimizer.TFOptimizer, "_backend_update_step", _sum_then_merge)
        _replace(optimizer.TFOptimizer, "_distributed_tf_update_step", _update_only)
        applied.append("gradient sum")
    if not hasattr(loss_module, "scale_loss_for_distribution"):
        _replace(tf_trainer.TensorFlowTrainer, "train_step", _train_step_per_replica)
        _replace(base_optimizer.BaseOptimizer, "apply_gradients", _apply_divided)
        applied.append("loss per replica")
    keras_variable = getattr(common_variables, "Variable", None) or common_variables.KerasVariable
    if not hasattr(keras_variable, "synchronization"):
        _replace(metric.Metric, "add_variable", _add_variable_on_read)
        _replace(tf_core.Variable, "_deferred_initialize", _deferred_on_read)
        applied.append("metrics per replica")
    return applied


def sums_in_merge(optimizer_class: Any) -> bool:
    """Whether the optimizer sums the gradients inside its merge call (Keras 3.3), where
    the sum is a no-op, instead of before it (3.4 and later). Fixed: False."""
    update = getattr(optimizer_class, "_distributed_tf_update_step", None)
    if update is None or getattr(update, _MARK, False):
        return False
    return REDUCTION in update.__code__.co_names


def _replace(owner: Any, name: str, make: Any) -> None:
    original = getattr(owner, name)
    if getattr(original, _MARK, False):
        return
    replacement = make(original)
    replacement.__name__, replacement.__doc__ = original.__name__, original.__doc__
    setattr(replacement, _MARK, True)
    setattr(owner, name, replacement)


class _Int64SeedBackend:
    """Keras's backend, but a ``uint32`` variable is made ``int64`` (the seed state)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def Variable(self, *args: Any, dtype: Any = None, **kwargs: Any) -> Any:
        return self._real.Variable(*args, dtype="int64" if dtype == "uint32" else dtype, **kwargs)


def _seed_generator_init(original: Any) -> Any:
    def __init__(self: Any, seed: Any = None, name: Any = None, **kwargs: Any) -> None:
        from keras.src import backend

        kwargs.setdefault("backend", _Int64SeedBackend(backend))
        original(self, seed, name, **kwargs)

    return __init__


def _sum_then_merge(original: Any) -> Any:
    """Keras 3.4's ``_backend_update_step``: sum in the replica context, then merge."""

    def _backend_update_step(
        self: Any, grads: Any, trainable_variables: Any, learning_rate: Any
    ) -> Any:
        import tensorflow as tf
        from keras.src import backend

        variables = [v.value if isinstance(v, backend.Variable) else v for v in trainable_variables]
        grads_and_vars = getattr(self, REDUCTION)(list(zip(grads, variables, strict=True)))
        tf.__internal__.distribute.interim.maybe_merge_call(
            self._distributed_tf_update_step,
            self._distribution_strategy,
            grads_and_vars,
            learning_rate,
        )

    return _backend_update_step


def _update_only(original: Any) -> Any:
    """Keras 3.4's ``_distributed_tf_update_step``: the gradients arrive summed."""

    def _distributed_tf_update_step(
        self: Any, distribution: Any, grads_and_vars: Any, learning_rate: Any
    ) -> Any:
        def apply_grad_to_update_var(var: Any, grad: Any, learning_rate: Any) -> Any:
            return self.update_step(grad, var, learning_rate)

        for grad, var in grads_and_vars:
            distribution.extended.update(
                var, apply_grad_to_update_var, args=(grad, learning_rate), group=False
            )

    return _distributed_tf_update_step


def _train_step_per_replica(original: Any) -> Any:
    """``train_step``, with the replicas in sync known to the optimizer while it runs."""

    def train_step(self: Any, data: Any) -> Any:
        import tensorflow as tf

        previous = getattr(_IN_FIT, "replicas", 1)
        _IN_FIT.replicas = tf.distribute.get_strategy().num_replicas_in_sync
        try:
            return original(self, data)
        finally:
            _IN_FIT.replicas = previous

    return train_step


def _apply_divided(original: Any) -> Any:
    """``apply_gradients``, each gradient divided by the replicas inside ``fit``'s step."""

    def apply_gradients(self: Any, grads_and_vars: Any) -> Any:
        replicas = getattr(_IN_FIT, "replicas", 1)
        if replicas > 1:
            grads_and_vars = [(divided(g, replicas), v) for g, v in grads_and_vars]
        return original(self, grads_and_vars)

    return apply_gradients


def divided(gradient: Any, replicas: int) -> Any:
    """``gradient / replicas`` for a dense or sparse (``IndexedSlices``) gradient."""
    import tensorflow as tf

    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        values = divided(gradient.values, replicas)
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    return gradient * tf.cast(1.0 / replicas, gradient.dtype)


ON_READ = "_slurmtf_on_read"  # a metric variable's aggregation, for its deferred creation
_AGGREGATIONS = {"sum": "SUM", "mean": "MEAN", "only_first_replica": "ONLY_FIRST_REPLICA"}


@contextlib.contextmanager
def _on_read(aggregation: str) -> Iterator[None]:
    """Variables created inside: synchronised on read, aggregated as ``aggregation``."""
    import tensorflow as tf

    def creator(next_creator: Any, **kwargs: Any) -> Any:
        kwargs["synchronization"] = tf.VariableSynchronization.ON_READ
        kwargs["aggregation"] = getattr(tf.VariableAggregation, _AGGREGATIONS[aggregation])
        return next_creator(**kwargs)

    with tf.variable_creator_scope(creator):
        yield


def _add_variable_on_read(original: Any) -> Any:
    """``Metric.add_variable``: its variable synchronised on read and aggregated as the
    metric asks (``sum`` by default), as Keras 3.10 creates it; also when Keras creates
    it later (a variable made while Keras builds the metrics symbolically)."""

    def add_variable(  # noqa: PLR0917 (Keras's own signature)
        self: Any, shape: Any, initializer: Any, dtype: Any = None, aggregation: str = "sum",
        name: Any = None,
    ) -> Any:  # fmt: skip
        import tensorflow as tf

        if aggregation not in _AGGREGATIONS or not tf.distribute.has_strategy():
            return original(self, shape, initializer, dtype, aggregation, name)
        with _on_read(aggregation):
            variable = original(self, shape, initializer, dtype, aggregation, name)
        setattr(variable, ON_READ, aggregation)
        return variable

    return add_variable


def _deferred_on_read(original: Any) -> Any:
    """``Variable._deferred_initialize``: a metric's variable created on read."""

    def _deferred_initialize(self: Any) -> Any:
        import tensorflow as tf

        aggregation = getattr(self, ON_READ, None)
        if aggregation is None or not tf.distribute.has_strategy():
            return original(self)
        with _on_read(aggregation):
            return original(self)

    return _deferred_initialize
