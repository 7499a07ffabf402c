"""Keras 3 ``model.fit`` under ``MultiWorkerMirroredStrategy``: the fixes slurmtf applies.

Keras 3 (3.15 with TensorFlow 2.21) cannot run ``fit``/``evaluate`` under
``MultiWorkerMirroredStrategy`` (keras-team/keras#20585). Measured causes, all in
``keras/src/backend/tensorflow/trainer.py`` and ``keras/src/callbacks``:

1. ``TensorFlowTrainer._maybe_symbolic_build`` builds the model from one batch of the
   distributed dataset and first reduces that per-replica batch with an eager
   ``strategy.reduce("MEAN", ...)``: under several workers that is a collective on the
   input tensors, which fails (``Attempt to convert a value (PerReplica...)``). The batch
   only gives shapes, so the fix builds from this worker's first local replica batch.
2. ``reduce_per_replica`` reduces the logs of a step across workers with
   ``strategy.reduce("MEAN", v, axis=0)`` (and ``"SUM"`` without an axis). Logs are
   scalars, so ``axis=0`` fails (``Invalid reduction dimension 0 for input with 0
   dimensions``). The fix reduces across replicas only (``axis=None``): the element-wise
   mean of the replicas' metric results, what the single-worker path computes.
3. ``ModelCheckpoint``, ``BackupAndRestore`` and ``TensorBoard`` have every worker write
   the same files (two workers crash on one ``latest.weights.h5``). Every worker must
   still save (reading synchronised variables is a collective), so, as ``tf_keras`` does,
   the chief writes the real path and the other workers a private temporary folder.
   ``BackupAndRestore`` restores every worker from the chief's (shared) folder.

:func:`enable_multiworker_fit` applies these once; :func:`slurmtf.resolver.cluster_resolver`
calls it, so the README's two lines are all a ``model.fit`` script needs. The fixes are
checked against the Keras versions they were tested on (:data:`TESTED_KERAS`): another
version gets a warning naming it (and an error when the patched functions changed shape);
``SLURMTF_KERAS_COMPAT=0`` turns the layer off. Imports Keras and TensorFlow.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurmtf.errors import SlurmtfError
from slurmtf.tf import compat, keras_distribute
from slurmtf.tf.releases import RELEASES

# The functions that handle a release difference (docs/TENSORFLOW_VERSIONS.md's table).
RELEASE_DIFFERENCES = ("enable_multiworker_fit", "first_batch")

# Keras minor versions the fixes were tested on end to end (2 workers, tests/e2e): the
# Keras 3 of each tested TensorFlow release.
TESTED_KERAS = tuple(".".join(r.keras.split(".")[:2]) for r in RELEASES if r.keras.startswith("3."))
ENV_SWITCH = "SLURMTF_KERAS_COMPAT"
_MARK = "_slurmtf_multiworker_fit"
_state: dict[str, Any] = {"applied": False, "tmp": None}


def tested(version: str) -> bool:
    """Whether a Keras version string (``3.15.1``) is one the fixes were tested on."""
    return any(version == t or version.startswith(t + ".") for t in TESTED_KERAS)


def legacy_keras_selected(environ: dict[str, str] | None = None) -> bool:
    """``TF_USE_LEGACY_KERAS`` makes ``tf.keras`` the ``tf_keras`` package (Keras 2)."""
    env = os.environ if environ is None else environ
    return env.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")


def enable_multiworker_fit(*, environ: dict[str, str] | None = None) -> bool:
    """Make Keras 3 ``fit``/``evaluate``/``predict`` and its file-writing callbacks work
    under ``MultiWorkerMirroredStrategy``. Idempotent; returns whether the fixes are on.

    Off (returns ``False``) with ``SLURMTF_KERAS_COMPAT=0`` or when Keras is not Keras 3
    (:func:`slurmtf.tf.compat.is_keras_3`).
    """
    env = os.environ if environ is None else environ
    if env.get(ENV_SWITCH, "1").strip() == "0":
        return False
    if _state["applied"]:
        return True
    import keras

    if not compat.is_keras_3(keras):
        return False
    version = str(keras.__version__)
    from keras.src.backend.tensorflow import trainer as tf_trainer
    from keras.src.callbacks import backup_and_restore, model_checkpoint, tensorboard

    # Keras 3.3 (TensorFlow 2.16's) has no symbolic build: its fit builds the model lazily,
    # in the replicas' own context, and needs no fix there (docs/TENSORFLOW_VERSIONS.md).
    targets: list[tuple[Any, str, Callable[[Any], Any]]] = [
        (tf_trainer, "reduce_per_replica", _reduce_per_replica),
        (model_checkpoint.ModelCheckpoint, "_get_file_path", _checkpoint_path),
        (backup_and_restore.BackupAndRestore, "_save_model", _backup_save),
        (backup_and_restore.BackupAndRestore, "on_train_end", _backup_train_end),
        (backup_and_restore.BackupAndRestore, "on_train_begin", _backup_train_begin),
        (tensorboard.TensorBoard, "set_model", _tensorboard_set_model),
    ]
    missing = [f"{getattr(o, '__name__', o)}.{n}" for o, n, _ in targets if not hasattr(o, n)]
    if missing:
        raise SlurmtfError(
            f"Keras {version}: {', '.join(missing)} not found, so slurmtf cannot make "
            f"model.fit work under MultiWorkerMirroredStrategy (tested: Keras "
            f"{', '.join(TESTED_KERAS)}). HINT: install the Keras of your TensorFlow's "
            f"release (docs/TENSORFLOW_VERSIONS.md), or use tf_keras (TF_USE_LEGACY_KERAS=1) "
            f"or slurmtf.train (docs/BRING_YOUR_OWN.md)"
        )
    if hasattr(tf_trainer.TensorFlowTrainer, "_maybe_symbolic_build"):
        targets.append((tf_trainer.TensorFlowTrainer, "_maybe_symbolic_build", _symbolic_build))
    if not tested(version):
        warnings.warn(
            f"slurmtf: Keras {version} is not a version the multi-worker model.fit fixes "
            f"were tested on ({', '.join(TESTED_KERAS)}); they are applied anyway. Check "
            f"that every rank logs the same losses, or set {ENV_SWITCH}=0 to turn them off",
            RuntimeWarning,
            stacklevel=2,
        )
    for owner, name, make in targets:
        _patch(owner, name, make)
    keras_distribute.fix_older_keras()
    _state["applied"] = True
    return True


def _patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    original = getattr(owner, name)
    if getattr(original, _MARK, False):
        return
    replacement = make(original)
    functools.update_wrapper(replacement, original)
    setattr(replacement, _MARK, True)
    setattr(owner, name, replacement)


# 1. Build from this worker's first local batch: shapes only, no collective.
def _symbolic_build(original: Any) -> Any:
    def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
        if self._distribute_strategy is None or iterator is None:
            return original(self, iterator=iterator, data_batch=data_batch)
        import tensorflow as tf
        from keras.src import tree

        strategy = self.distribute_strategy
        batch = first_batch(iterator)
        local = tree.map_structure(
            lambda x: (
                strategy.experimental_local_results(x)[0]
                if isinstance(x, tf.distribute.DistributedValues)
                else x
            ),
            batch,
        )
        return original(self, iterator=None, data_batch=local)

    return _maybe_symbolic_build


def first_batch(iterator: Any) -> Any:
    """The first batch of a Keras epoch iterator, whichever protocol its release has:
    ``enumerate_epoch()`` yielding ``(step, iterator)`` (Keras 3.5), iterating it yields
    ``(step, iterator)`` (3.8-3.10) or ``(begin, end, iterator)`` (3.11 and later)."""
    steps = iterator.enumerate_epoch() if hasattr(iterator, "enumerate_epoch") else iterator
    for item in steps:
        return next(item[-1])
    return None


# 2. Logs of a step: mean (or sum) across replicas, element-wise, never along axis 0.
def _reduce_per_replica(original: Any) -> Any:
    def reduce_per_replica(values: Any, strategy: Any, reduction: Any) -> Any:
        from keras.src import tree
        from keras.src.backend.tensorflow import trainer as tf_trainer

        if not tf_trainer._collective_all_reduce_multi_worker(strategy):
            return original(values, strategy, reduction)
        if reduction == "auto":
            reduction = "mean"
        if reduction in ("mean", "sum"):
            op = "MEAN" if reduction == "mean" else "SUM"
            return tree.map_structure(lambda v: strategy.reduce(op, v, axis=None), values)
        return original(values, strategy, reduction)

    return reduce_per_replica


# 3. Files: the chief writes the real paths, other workers a private temporary folder.
def is_chief(model: Any) -> bool:
    """Whether this worker writes checkpoints (``strategy.extended.should_checkpoint``)."""
    strategy = getattr(model, "distribute_strategy", None)
    extended = getattr(strategy, "extended", None)
    return bool(getattr(extended, "should_checkpoint", True))


def worker_tmpdir() -> str:
    """This process's throwaway folder for a non-chief worker's files (removed at exit)."""
    if _state["tmp"] is None:
        path = tempfile.mkdtemp(prefix="slurmtf-worker-")
        atexit.register(shutil.rmtree, path, True)
        _state["tmp"] = path
    return str(_state["tmp"])


def _private(path: str) -> str:
    """``path`` moved under this worker's temporary folder (same relative name)."""
    relative = Path(path).absolute().relative_to("/")
    return str(Path(worker_tmpdir()) / relative)


def _checkpoint_path(original: Any) -> Any:
    def _get_file_path(self: Any, epoch: Any, batch: Any, logs: Any) -> Any:
        path = original(self, epoch, batch, logs)
        return path if is_chief(self.model) else _private(str(path))

    return _get_file_path


_BACKUP_PATHS = (  # the last two from Keras 3.8
    "backup_dir",
    "_weights_path",
    "_training_metadata_path",
    "_prev_weights_path",
    "_prev_training_metadata_path",
)


def _backup_save(original: Any) -> Any:
    def _save_model(self: Any) -> Any:
        if is_chief(self.model):
            return original(self)
        shared = {name: getattr(self, name) for name in _BACKUP_PATHS if hasattr(self, name)}
        try:
            for name, path in shared.items():
                setattr(self, name, _private(str(path)))
            return original(self)
        finally:
            for name, path in shared.items():
                setattr(self, name, path)

    return _save_model


def _backup_train_begin(original: Any) -> Any:
    """The restore, inside the model's strategy: it builds the optimizer first, which Keras
    3.3 does in no strategy scope ("Need to be inside strategy.scope()" after a requeue)."""

    def on_train_begin(self: Any, logs: Any = None) -> Any:
        strategy = getattr(self.model, "distribute_strategy", None)
        if strategy is None:
            return original(self, logs)
        with strategy.scope():
            return original(self, logs)

    return on_train_begin


def _backup_train_end(original: Any) -> Any:
    def on_train_end(self: Any, logs: Any = None) -> Any:
        if is_chief(self.model):
            return original(self, logs)
        return None  # the chief removes the shared folder

    return on_train_end


def _tensorboard_set_model(original: Any) -> Any:
    def set_model(self: Any, model: Any) -> Any:
        if is_chief(model):
            return original(self, model)
        log_dir = self.log_dir
        self.log_dir = _private(str(log_dir))
        try:
            return original(self, model)
        finally:
            self.log_dir = log_dir

    return set_model
