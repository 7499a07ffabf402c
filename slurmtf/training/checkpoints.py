"""Checkpoints with ``tf.train.CheckpointManager``: the chief writes, the others pretend.

Every worker takes part in a save (collectives may run while variables are read), but
only the chief writes into ``--model_dir``; other ranks write to a private temporary
directory that is deleted after each save. A save is atomic: TensorFlow writes the data
files first and then replaces the small ``checkpoint`` state file by rename, so a run
killed mid-save resumes from the previous complete checkpoint.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from absl import logging


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
