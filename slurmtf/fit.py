"""Preemption for ``model.fit`` scripts: save, exit 75, let the job script requeue, resume.

``PreemptionCheckpoint(backup_dir)`` is Keras's ``BackupAndRestore`` (of ``tf.keras``:
Keras 3, or ``tf_keras`` with ``TF_USE_LEGACY_KERAS=1``) plus a handler for the
preemption signal (USR2, as ``jobs/*.sbatch`` and ``slurmtf submit`` ask Slurm to send
before the time limit)::

    from slurmtf.fit import PreemptionCheckpoint

    model.fit(dataset, epochs=20, steps_per_epoch=500,
              callbacks=[PreemptionCheckpoint(os.path.join(os.environ["MODEL_DIR"], "backup"))])

* It saves the model and optimizer at the end of every epoch (the chief writes; with
  Keras 3 through :mod:`slurmtf.tf.keras_compat`) and restores them when a requeued job
  starts ``fit`` again, which then continues at the next epoch.
* On the signal, every rank learns of it after the same batch (the flag is summed over
  the workers after each batch), saves the model and optimizer there with the epoch and
  the batches it has trained (``slurmtf-position.json`` beside the backup, the chief's),
  prints ``{"event": "preempted", ...}`` and exits 75 (``EX_TEMPFAIL``);
  ``jobs/train.sbatch`` and ``slurmtf submit`` requeue the job.
* The requeued ``fit`` resumes that epoch at that batch: it reads the batches the epoch
  had trained and drops them, and trains the rest (:mod:`slurmtf.tf.fit_resume`), so a
  planned stop redoes no step. An epoch that reads the same data each time (a finite
  dataset without reshuffling, or ``steps_per_epoch`` times the batch equal to its size)
  resumes to exactly the weights of an uninterrupted run.
* A failure (a rank lost) resumes from the last epoch's backup: up to one epoch of steps
  is computed again. Keras runs a step as one function, which a peer's failure can cut
  inside the optimizer's update, so no survivor's memory is saved there; slurmtf's own
  loop (``slurmtf.train``, docs/BRING_YOUR_OWN.md) redoes at most one step.

``AllocationBoard()`` writes what slurmtf knows of the allocation into TensorBoard, as
the bundled models' chief does (:mod:`slurmtf.training.fit_board`): each start, the
restarts, requeues and preemptions before it with their cause and cost, the job's
goodput, steps (and, given ``global_batch_size``, examples) per second, and the node's
GPUs, in ``<MODEL_DIR>/allocation``. ``slurmtf run`` adds one to every ``fit`` of a
script that has none (``SLURMTF_FIT_BOARD=0``: not)::

    model.fit(dataset, epochs=20, steps_per_epoch=500,
              callbacks=[AllocationBoard(global_batch_size=256)])

``TrackerLogger()`` sends ``fit``'s metrics to the job's tracker runs, MLflow and W&B
(:mod:`slurmtf.training.trackers`: the chief alone, one run per job across restarts and
requeues), at the model's global step (``optimizer.iterations``)::

    model.fit(dataset, epochs=20, steps_per_epoch=500,
              callbacks=[PreemptionCheckpoint(backup), TrackerLogger(every=10)])

* every ``every``-th step's batch logs as ``train/<name>``, each epoch's validation as
  ``eval/<name>`` (``val_`` dropped);
* a step the job's run has logged before (the epoch a restart computes again) is not
  sent again: each step is logged once.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurmtf import events
from slurmtf.contracts import EXIT_PREEMPTED
from slurmtf.tf import compat
from slurmtf.tf.keras_compat import is_chief
from slurmtf.training.preemption import PreemptionWatcher

__all__ = ["EXIT_PREEMPTED"]  # PreemptionCheckpoint, TrackerLogger, AllocationBoard: lazily

_classes: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    """``PreemptionCheckpoint`` and ``TrackerLogger`` are built on first use, on the
    ``tf.keras`` in use."""
    if name == "PreemptionCheckpoint":
        return _preemption_checkpoint_class()
    if name == "TrackerLogger":
        return _tracker_logger_class()
    if name == "AllocationBoard":
        return _callback_class("AllocationBoard", _WriteAllocation)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _rank(strategy: Any) -> int:
    resolver = getattr(strategy, "cluster_resolver", None)
    task_id = getattr(resolver, "task_id", None)
    return int(task_id) if task_id is not None else 0


def _preemption_checkpoint_class() -> Any:
    """``PreemptionCheckpoint`` on the ``BackupAndRestore`` of the ``tf.keras`` in use
    (Keras 3's or tf_keras's, known only once TensorFlow is imported); built once each."""
    import tensorflow as tf

    base = tf.keras.callbacks.BackupAndRestore
    key = f"{base.__module__}.{base.__qualname__}"
    if key in _classes:
        return _classes[key]
    if base.__module__.startswith("keras"):
        from slurmtf.tf import keras_compat

        keras_compat.enable_multiworker_fit()  # chief-only backup files
    from slurmtf.tf import fit_resume

    fit_resume.enable_skip(importlib.import_module(base.__module__.split(".")[0]))

    class PreemptionCheckpoint(_ExitOnPreemption, base):  # type: ignore[misc, valid-type]
        """``BackupAndRestore`` that exits 75 on the preemption signal (module doc)."""

    _classes[key] = PreemptionCheckpoint
    return PreemptionCheckpoint


FIT_BOARD_ENV = "SLURMTF_FIT_BOARD"  # "0": slurmtf run adds no AllocationBoard to fit


def add_board_to_fit(keras_module: Any) -> bool:
    """Give every ``fit`` of ``keras_module``'s models (Keras 3's ``keras``, Keras 2's, or
    ``tf_keras``) an :class:`AllocationBoard` when its callbacks (a keyword) have none;
    ``fit``'s ``batch_size`` is the board's global batch. Idempotent; False when the
    module has no ``Model.fit``."""
    model: Any = getattr(keras_module, "Model", None)
    original = getattr(model, "fit", None)
    if model is None or original is None:
        return False
    if getattr(original, "_slurmtf_board", False):
        return True

    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        callbacks = list(kwargs.get("callbacks") or [])
        if len(args) <= 5 and not any(type(c).__name__ == "AllocationBoard" for c in callbacks):
            board = _callback_class("AllocationBoard", _WriteAllocation, keras_module)
            batch = kwargs.get("batch_size") if isinstance(kwargs.get("batch_size"), int) else None
            kwargs["callbacks"] = [*callbacks, board(global_batch_size=batch)]
        return original(self, *args, **kwargs)

    fit.__doc__, fit.__name__ = original.__doc__, original.__name__
    fit._slurmtf_board = True  # type: ignore[attr-defined]
    model.fit = fit
    return True


def _tracker_logger_class() -> Any:
    """``TrackerLogger`` on the ``Callback`` of the ``tf.keras`` in use; built once each."""
    return _callback_class("TrackerLogger", _LogToTrackers)


def _callback_class(name: str, mixin: type, keras_module: Any = None) -> Any:
    """``name``: ``mixin`` on the ``Callback`` of the ``tf.keras`` in use (or of
    ``keras_module``'s ``callbacks``); built once each."""
    if keras_module is None:
        import tensorflow as tf

        keras_module = tf.keras
    base = keras_module.callbacks.Callback
    key = f"{name}:{base.__module__}.{base.__qualname__}"
    if key not in _classes:
        _classes[key] = type(name, (mixin, base), {"__doc__": mixin.__doc__})
    return _classes[key]


# The Keras callback the mixins below go with; for mypy only (at run time: object).
_Callback: Any = object
POSITION = "slurmtf-position.json"  # beside a PreemptionCheckpoint's backup: where it stopped


class _ExitOnPreemption(_Callback):  # type: ignore[misc]
    """The preemption half of ``PreemptionCheckpoint``, placed before its
    ``BackupAndRestore`` base: every hook calls the base's, then acts on the signal."""

    model: Any  # set by Keras
    params: Any  # set by Keras: the steps of an epoch, when known
    backup_dir: str  # the base's

    def __init__(
        self, backup_dir: str, *, signal: str = "USR2", check_every: int = 1, **kwargs: Any
    ) -> None:
        if check_every < 1:
            from slurmtf.errors import InputError

            raise InputError("check_every", check_every, "must be at least 1", "pass 1")
        super().__init__(backup_dir, **kwargs)
        self._watcher = PreemptionWatcher(signal)
        self._check_every = check_every
        self._batches = 0
        self._epoch = 0
        self._agree: Any = None
        self._at_epoch_end: int | None = None  # the batch a stop at the epoch's end came at

    def on_train_begin(self, logs: Any = None) -> None:
        from slurmtf.tf import fit_resume

        self._watcher.install()
        super().on_train_begin(logs)
        strategy = self.model.distribute_strategy
        initial = compat.fit_initial_epoch(self.model)  # Keras 3's, Keras 2's or tf_keras's
        batches = (
            self._position().get("batches", 0) if self._position().get("epoch") == initial else 0
        )
        fit_resume.skip_next_epoch(batches)
        events.emit("fit_start", rank=_rank(strategy), initial_epoch=initial, initial_batch=batches)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch = epoch
        super().on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        super().on_epoch_end(epoch, logs)  # the epoch's backup: the position is older
        if is_chief(self.model):
            with contextlib.suppress(FileNotFoundError):
                self._position_path().unlink()
        if self._at_epoch_end is not None:  # stopped at the epoch's last batch
            self._exit(self._at_epoch_end)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        super().on_train_batch_end(batch, logs)
        self._batches += 1
        if self._batches % self._check_every == 0 and self._preempted():
            if batch + 1 == (self.params or {}).get("steps"):
                self._at_epoch_end = batch  # the epoch's end saves it, validation included
                return
            self._save_position(batch + 1)  # `batch`: the epoch's last batch trained
            self._exit(batch)

    def _exit(self, batch: int) -> None:
        strategy = self.model.distribute_strategy
        step = int(self.model.optimizer.iterations.numpy())  # the steps trained in all
        events.emit("preempted", rank=_rank(strategy), epoch=self._epoch, batch=batch, step=step)
        self._watcher.uninstall()
        raise SystemExit(EXIT_PREEMPTED)

    def _position_path(self) -> Path:
        return Path(self.backup_dir) / POSITION

    def _position(self) -> dict[str, int]:
        """The saved epoch and the batches it had trained, or {} (none, or unreadable)."""
        try:
            found = json.loads(self._position_path().read_text())
        except (OSError, ValueError):
            return {}
        return {k: int(v) for k, v in found.items() if k in ("epoch", "batches")}

    def _save_position(self, batches: int) -> None:
        """The backup now (every rank: reading synchronised variables is a collective)
        with the epoch it is in, then the chief's position file (written whole)."""
        from slurmtf.tf import fit_resume

        fit_resume.back_up_in_epoch(self, self._epoch)
        if is_chief(self.model):
            path = self._position_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(json.dumps({"epoch": self._epoch, "batches": batches}))
            tmp.replace(path)

    def on_train_end(self, logs: Any = None) -> None:
        self._watcher.uninstall()
        super().on_train_end(logs)

    def _preempted(self) -> bool:
        """Whether any worker got the signal: one small all-reduce across the job."""
        import tensorflow as tf

        strategy = self.model.distribute_strategy
        if strategy.num_replicas_in_sync == 1:
            return self._watcher.requested
        if self._agree is None:

            @tf.function  # type: ignore[untyped-decorator]
            def agree(flag: Any) -> Any:
                per_replica = strategy.run(tf.identity, args=(flag,))
                return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

            self._agree = agree
        flag = tf.constant(1.0 if self._watcher.requested else 0.0)
        return float(self._agree(flag)) > 0


class _LogToTrackers(_Callback):  # type: ignore[misc]
    """The tracker half of ``TrackerLogger``: :class:`slurmtf.training.trackers.Trackers`
    opened at the start of ``fit`` and closed at its end."""

    model: Any  # set by Keras

    def __init__(self, *, every: int = 1, params: Mapping[str, Any] | None = None) -> None:
        if every < 1:
            from slurmtf.errors import InputError

            raise InputError("every", every, "must be at least 1", "pass 1 to log every step")
        super().__init__()
        self._every = every
        self._params = dict(params or {})
        self._trackers: Any = None

    def on_train_begin(self, logs: Any = None) -> None:
        from slurmtf.training.trackers import Trackers

        rank = _rank(self.model.distribute_strategy)
        self._trackers = Trackers.start(os.environ, rank, rank == 0, self._params)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        step = self._step()
        if self._trackers is not None and step % self._every == 0:
            self._trackers.log("train", step, _scalars(logs))

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        found = {
            k.removeprefix("val_"): v for k, v in _scalars(logs).items() if k.startswith("val_")
        }
        if self._trackers is not None and found:
            self._trackers.log("eval", self._step(), found)

    def on_train_end(self, logs: Any = None) -> None:
        if self._trackers is not None:
            self._trackers.close()
            self._trackers = None

    def _step(self) -> int:
        """The global step: the optimizer's updates so far (restored with the model)."""
        return int(self.model.optimizer.iterations.numpy())


class _WriteAllocation(_Callback):  # type: ignore[misc]
    """``fit``'s allocation run, written by the chief (module doc)."""

    model: Any  # set by Keras

    def __init__(
        self,
        folder: str | None = None,
        *,
        every_s: float | None = None,
        global_batch_size: int | None = None,
    ) -> None:
        from slurmtf.training.fit_board import EVERY_S

        every = EVERY_S if every_s is None else every_s
        if every <= 0 or (global_batch_size is not None and global_batch_size < 1):
            from slurmtf.errors import InputError

            name, value = (
                ("every_s", every) if every <= 0 else ("global_batch_size", global_batch_size)
            )
            raise InputError(name, value, "must be positive", "leave it out for the default")
        super().__init__()
        self._folder, self._every, self._batch = folder, every, global_batch_size
        self._board: Any = None

    def on_train_begin(self, logs: Any = None) -> None:
        from slurmtf.training.fit_board import FitBoard, board_folder

        folder = board_folder(self._folder, os.environ)
        if folder is None or not is_chief(self.model) or self._board is not None:
            return
        from slurmtf.training.export import AllocationWriter

        writer = AllocationWriter(folder)
        self._board = FitBoard.open(
            folder, writer, os.environ, self._step(), every_s=self._every,
            global_batch=self._batch,
        )  # fmt: skip

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._board is not None:
            self._board.batch_end(self._step())

    def on_train_end(self, logs: Any = None) -> None:
        if self._board is not None:
            self._board.close(self._step())
            self._board = None

    def _step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())


def _scalars(logs: Any) -> dict[str, float]:
    """The numbers among Keras's ``logs``."""
    found = {}
    for name, value in dict(logs or {}).items():
        with contextlib.suppress(TypeError, ValueError):
            found[str(name)] = float(value)
    return found
