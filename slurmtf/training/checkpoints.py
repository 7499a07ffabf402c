"""Checkpoints with ``tf.train.CheckpointManager``: the chief writes, the others pretend.

Every worker takes part in a save (collectives may run while variables are read), but
only the chief writes into ``--model_dir``; other ranks write to a private temporary
directory that is deleted after each save. A save is atomic: TensorFlow writes the data
files first and then replaces the small ``checkpoint`` state file by rename, so a run
killed mid-save resumes from the previous complete checkpoint.

A start resumes from the newest state there is: the last periodic checkpoint, or a
rescue of its step or a later one, which the ranks that lived through a peer's failure wrote from
memory (:mod:`slurmtf.training.rescue`).

Asynchronous saves (``--async_checkpoint``, where the release has them:
:func:`slurmtf.tf.compat.async_checkpoint_options`) stall training only to copy the
variables into host memory; a thread writes the files, and the ``checkpoint`` state file
names the save only once they are complete. A save waits for the one before it, the end
of training (:meth:`Checkpointer.sync`) for the last, and a rank that dies meanwhile
leaves the previous save as the latest. Rescues are pruned only once a later periodic
save is complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from absl import logging

from slurmtf.tf import compat
from slurmtf.training import rescue

WORKERS_FILE = "workers.json"  # in --model_dir: how many workers the last start had
_CKPT = re.compile(r"ckpt-(\d+)$")


@dataclasses.dataclass(frozen=True)
class Resumed:
    """What a start restored: the path read, its step and where it came from."""

    path: str
    step: int
    source: str  # "checkpoint" or "rank R's memory"
    complete: bool = True  # it set every variable of the run (False: some kept their start)


class Checkpointer:
    """Saves and restores ``tf.train.Checkpoint(**objects)``; resumes from the latest."""

    def __init__(
        self,
        model_dir: str | None,
        is_chief: bool,
        objects: dict[str, Any],
        max_to_keep: int = 3,
        *,
        rank: int = 0,
        asynchronous: bool = False,
    ) -> None:
        import tensorflow as tf

        self.enabled = model_dir is not None
        self.is_chief = is_chief
        self._checkpoint = tf.train.Checkpoint(**objects)
        self._max_to_keep = max_to_keep
        self._model_dir = model_dir
        self._rank = rank
        self._manager: Any = None
        self._options = compat.async_checkpoint_options() if asynchronous else None
        self._scratch: str | None = None  # a non-chief's folder for asynchronous saves
        self._issued: int | None = None  # the step of the chief's last save, maybe unwritten
        if self._options is not None:
            import keras

            compat.mend_async_copy(keras)
        if self.enabled and is_chief:
            self._manager = tf.train.CheckpointManager(
                self._checkpoint, str(Path(str(model_dir)) / "checkpoints"), max_to_keep=max_to_keep
            )
        elif self.enabled and self._options is not None:  # written later: a folder kept
            self._scratch = str(fresh_scratch(str(model_dir), rank))
            self._manager = tf.train.CheckpointManager(self._checkpoint, self._scratch, 1)

    @property
    def asynchronous(self) -> bool:
        """Whether saves write in the background."""
        return self._options is not None

    def latest(self) -> Resumed | None:
        """The newest complete state in ``--model_dir`` (:func:`newest_state`); None for a
        first start."""
        if not self.enabled:
            return None
        return newest_state(self._last_periodic(), self._model_dir)

    def restore_latest(self) -> Resumed | None:
        """Restore the newest state on every rank (all read the same files)."""
        found = self.latest()
        if found is not None:
            status = self._checkpoint.restore(found.path)
            found = dataclasses.replace(found, complete=_sets_every_variable(status))
            status.expect_partial()
            logging.info(
                "Resumed from checkpoint %s (step %d, %s)", found.path, found.step, found.source
            )
        return found

    def rescue(self, step: int, rank: int) -> rescue.Rescue | None:
        """Write this rank's state as the rescue of ``step`` (a peer failed); None when
        there is no ``--model_dir``, another survivor writes that step or the last
        periodic checkpoint is newer."""
        if not self.enabled:
            return None
        periodic = self._last_periodic()
        saved = checkpoint_step(periodic) if periodic else None
        return rescue.save(self._checkpoint, str(self._model_dir), step, rank, saved)

    def _last_periodic(self) -> str | None:
        """The prefix of the last complete periodic checkpoint in ``--model_dir``."""
        import tensorflow as tf

        path: str | None = tf.train.latest_checkpoint(
            str(Path(str(self._model_dir)) / "checkpoints")
        )
        return path

    def save(self, step: int) -> str | None:
        """Save on every rank; returns the chief's checkpoint path (None elsewhere)."""
        import tensorflow as tf

        if not self.enabled:
            return None
        if self._manager is not None:
            path: str = self._manager.save(checkpoint_number=step, options=self._options)
            if not self.is_chief:
                return None
            logging.info("Saved checkpoint %s%s", path, " (writing)" if self._options else "")
            # What the rescues held is in a complete save: this one, or (asynchronous) the
            # one before it, which this save waited for.
            done = self._issued if self._options is not None else step
            self._issued = step
            if done is not None:
                rescue.prune(self._model_dir, done)
            return path
        scratch = str(fresh_scratch(str(self._model_dir), self._rank))
        try:
            manager = tf.train.CheckpointManager(self._checkpoint, scratch, max_to_keep=1)
            manager.save(checkpoint_number=step)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None

    def sync(self) -> None:
        """Wait until every save is written (asynchronous saves), then prune the rescues
        the last one holds and remove a non-chief's folder."""
        if self._manager is None or self._options is None:
            return
        self._manager.sync()
        if self.is_chief and self._issued is not None:
            rescue.prune(self._model_dir, self._issued)
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
            self._manager = None


def fresh_scratch(model_dir: str, rank: int) -> Path:
    """A non-chief's empty folder for the saves only the chief keeps, under ``$TMPDIR``:
    one per model folder and rank, so that a restarted rank reuses (and empties) what a
    killed one left instead of leaving a copy per failure."""
    digest = hashlib.sha1(str(Path(model_dir).absolute()).encode()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"slurmtf-ckpt-{os.getuid()}-{digest}-rank{rank}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def newest_state(periodic: str | None, model_dir: str | Path | None) -> Resumed | None:
    """The state a start resumes from: the survivors' newest rescue in ``model_dir`` when
    it holds at least the step of the last periodic checkpoint ``periodic`` (at the same
    step both hold the same state, and the restart line names the survivor), else that
    checkpoint; None when there is neither."""
    saved = rescue.newest(model_dir)
    step = 0 if periodic is None else checkpoint_step(periodic) or 0
    if saved is not None and (periodic is None or saved.step >= step):
        return Resumed(saved.prefix, saved.step, saved.source)
    return None if periodic is None else Resumed(periodic, step, "checkpoint")


def checkpoint_step(path: str) -> int | None:
    """``.../ckpt-120`` -> 120 (the chief saves with the step as checkpoint number)."""
    match = _CKPT.search(path)
    return None if match is None else int(match.group(1))


def previous_workers(model_dir: str | None) -> int | None:
    """The worker count the run in ``model_dir`` last started with (None: first start).

    Checkpoints of ``MultiWorkerMirroredStrategy`` hold each variable once, whatever the
    replica count, so a restart on another worker count (a ``--nodes`` range) restores
    them; this count only lets the ``cluster`` event say that it changed."""
    if model_dir is None:
        return None
    try:
        value = json.loads((Path(model_dir) / WORKERS_FILE).read_text())["num_workers"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) else None


def record_workers(model_dir: str | None, num_workers: int) -> None:
    """The chief notes this start's worker count in ``model_dir`` (atomic rename)."""
    if model_dir is None:
        return
    folder = Path(model_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        scratch = folder / f".{WORKERS_FILE}.{os.getpid()}"
        scratch.write_text(json.dumps({"num_workers": num_workers}) + "\n")
        scratch.replace(folder / WORKERS_FILE)
    except OSError as exc:
        logging.warning("Cannot record the worker count in %s: %s", folder, exc)


def _sets_every_variable(status: Any) -> bool:
    """Whether a restore's ``status`` set every variable of the objects it restored."""
    try:
        status.assert_existing_objects_matched()
    except AssertionError:
        return False
    return True
