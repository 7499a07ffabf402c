"""Checkpoints with ``tf.train.CheckpointManager``: the chief writes, the others pretend.

Every worker takes part in a save (collectives may run while variables are read), but
only the chief writes into ``--model_dir``; other ranks write to a private temporary
directory that is deleted after each save. A save is atomic: TensorFlow writes the data
files first and then replaces the small ``checkpoint`` state file by rename, so a run
killed mid-save resumes from the previous complete checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from absl import logging

WORKERS_FILE = "workers.json"  # in --model_dir: how many workers the last start had


class Checkpointer:
    """Saves and restores ``tf.train.Checkpoint(**objects)``; resumes from the latest."""

    def __init__(
        self, model_dir: str | None, is_chief: bool, objects: dict[str, Any], max_to_keep: int = 3
    ) -> None:
        import tensorflow as tf

        self.enabled = model_dir is not None
        self.is_chief = is_chief
        self._checkpoint = tf.train.Checkpoint(**objects)
        self._max_to_keep = max_to_keep
        self._model_dir = model_dir
        self._manager: Any = None
        if self.enabled and is_chief:
            self._manager = tf.train.CheckpointManager(
                self._checkpoint, str(Path(str(model_dir)) / "checkpoints"), max_to_keep=max_to_keep
            )

    def latest(self) -> str | None:
        """Path of the newest complete checkpoint in ``--model_dir``, or None."""
        import tensorflow as tf

        if not self.enabled:
            return None
        path: str | None = tf.train.latest_checkpoint(
            str(Path(str(self._model_dir)) / "checkpoints")
        )
        return path

    def restore_latest(self) -> str | None:
        """Restore the newest checkpoint on every rank (all read the chief's files)."""
        path = self.latest()
        if path is not None:
            self._checkpoint.restore(path).expect_partial()
            logging.info("Resumed from checkpoint %s", path)
        return path

    def save(self, step: int) -> str | None:
        """Save on every rank; returns the chief's checkpoint path (None elsewhere)."""
        import tensorflow as tf

        if not self.enabled:
            return None
        if self._manager is not None:
            path: str = self._manager.save(checkpoint_number=step)
            logging.info("Saved checkpoint %s", path)
            return path
        scratch = tempfile.mkdtemp(prefix="slurmtf-ckpt-")
        try:
            manager = tf.train.CheckpointManager(self._checkpoint, scratch, max_to_keep=1)
            manager.save(checkpoint_number=step)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None


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
