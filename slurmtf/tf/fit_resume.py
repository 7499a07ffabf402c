"""A ``model.fit`` resumed in the middle of an epoch reads the batches that epoch had
trained before the stop and drops them, then trains the rest: a planned stop
(:class:`slurmtf.fit.PreemptionCheckpoint`) redoes no step, and the next batch is the
one the stopped run would have read.

Keras has no such start: Keras 3's ``BackupAndRestore`` restores an epoch (the batch it
records is not read back), and Keras 2's (and ``tf_keras``'s) starts the step count of
a resumed epoch at the saved batch but reads that epoch's data from its first batch. So
:func:`enable_skip` wraps the loop over an epoch's batches of the Keras in use, found by
its feature (each is a release difference, docs/TENSORFLOW_VERSIONS.md):

* Keras 3.8 and later: the training epoch iterator's ``_enumerate_iterator`` (items
  ``(step, iterator)``, from 3.11 ``(begin, end, iterator)``);
* Keras 3.3 to 3.5: its ``enumerate_epoch`` (items ``(step, iterator)``);
* Keras 2 and ``tf_keras``: the data handler's ``enumerate_epochs``, whose step count
  then starts at the skipped batches too.

:func:`skip_next_epoch` arms it for the next epoch that starts (the resumed one: the
callback arms it as ``fit`` begins, after the restore). :func:`back_up_in_epoch` is the
backup a stop mid-epoch saves, which each Keras records its own way. Imports Keras.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterator
from typing import Any

# The functions that handle a release difference (docs/TENSORFLOW_VERSIONS.md's table).
RELEASE_DIFFERENCES = ("enable_skip", "back_up_in_epoch")

_MARK = "_slurmtf_skips"
_pending = {"batches": 0}


def skip_next_epoch(batches: int) -> None:
    """The next epoch ``fit`` starts reads and drops its first ``batches`` batches."""
    _pending["batches"] = max(int(batches), 0)


def pending() -> int:
    """The batches the next epoch will drop (0: none)."""
    return _pending["batches"]


def enable_skip(keras_module: Any) -> bool:
    """Wrap the batch loop of ``keras_module``'s ``fit`` (``keras``: Keras 3, or Keras 2 as
    TensorFlow 2.15's ``tf.keras``; ``tf_keras``). Idempotent; False when this Keras has
    none of the known loops (then a resumed epoch reads from its first batch)."""
    name = keras_module.__name__.split(".")[0]
    try:
        trainer = importlib.import_module(f"{name}.src.backend.tensorflow.trainer")
    except ImportError:
        trainer = None
    epochs = getattr(trainer, "TFEpochIterator", None)
    for method in ("_enumerate_iterator", "enumerate_epoch"):  # Keras 3.8+, 3.3-3.5
        if epochs is not None and hasattr(epochs, method):
            return _wrap(epochs, method, _skipping_batches)
    try:
        adapter = importlib.import_module(f"{name}.src.engine.data_adapter")
    except ImportError:
        return False
    handler = getattr(adapter, "DataHandler", None)
    if handler is None or not hasattr(handler, "enumerate_epochs"):
        return False
    return _wrap(handler, "enumerate_epochs", _skipping_epochs)


def back_up_in_epoch(callback: Any, epoch: int) -> None:
    """A ``BackupAndRestore`` callback's backup now, in the middle of ``epoch``, that its
    restore resumes at ``epoch`` (its batches skipped by :func:`skip_next_epoch`). Keras
    2's and tf_keras's save the epoch a variable of their training state holds (set as
    the epoch began), and resume at the one after it: it is set to ``epoch - 1`` first
    (``_backup``). Keras 3's record the epoch their callback holds (``_save_model``)."""
    if hasattr(callback, "_backup"):  # Keras 2, tf_keras
        callback._training_state._ckpt_saved_epoch.assign(epoch - 1)
        callback._backup(epoch=epoch - 1)
    else:  # Keras 3
        callback._current_epoch = epoch
        callback._save_model()


def _wrap(owner: Any, name: str, make: Callable[[Any], Any]) -> bool:
    original = getattr(owner, name)
    if not getattr(original, _MARK, False):
        wrapped = functools.wraps(original)(make(original))
        setattr(wrapped, _MARK, True)
        setattr(owner, name, wrapped)
    return True


def _skipping_batches(original: Any) -> Any:
    """Keras 3: an epoch's items whose first step is below the pending count are not
    yielded; their batches are read from the item's iterator and dropped."""

    def iterate(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        skip, _pending["batches"] = _pending["batches"], 0
        for item in original(self, *args, **kwargs):
            if item[0] < skip:
                count = item[1] - item[0] + 1 if len(item) == 3 else self.steps_per_execution
                for _ in range(int(count)):
                    next(item[-1])
                continue
            yield item

    return iterate


def _skipping_epochs(original: Any) -> Any:
    """Keras 2: the first epoch's iterator advanced by the pending count, and its step
    count starting there (it trains the epoch's other steps)."""

    def enumerate_epochs(self: Any) -> Iterator[Any]:
        skip, _pending["batches"] = _pending["batches"], 0
        for epoch, iterator in original(self):
            if skip:
                for _ in range(skip):
                    next(iterator)
                self._initial_step, skip = skip, 0
            yield epoch, iterator

    return enumerate_epochs
