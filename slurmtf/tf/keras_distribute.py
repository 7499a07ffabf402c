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

:func:`fix_older_keras` applies both (idempotent); the training loop calls it before it
builds a model under a strategy, ``slurmtf.tf.keras_compat.enable_multiworker_fit`` for
users' ``model.fit``. Imports Keras and TensorFlow.
"""

from __future__ import annotations

from typing import Any

REDUCTION = "_all_reduce_sum_gradients"
_MARK = "_slurmtf_fixed"


def fix_older_keras() -> list[str]:
    """Apply the fixes this Keras 3 needs; the names of those applied (none: Keras 2, or a
    release that needs none)."""
    import keras

    if not str(keras.__version__).startswith("3."):
        return []
    from keras.src import backend
    from keras.src.backend.tensorflow import optimizer
    from keras.src.random import seed_generator

    applied = []
    if not hasattr(backend, "random_seed_dtype"):
        _replace(seed_generator.SeedGenerator, "__init__", _seed_generator_init)
        applied.append("seed state")
    if sums_in_merge(optimizer.TFOptimizer):
        _replace(optimizer.TFOptimizer, "_backend_update_step", _sum_then_merge)
        _replace(optimizer.TFOptimizer, "_distributed_tf_update_step", _update_only)
        applied.append("gradient sum")
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
