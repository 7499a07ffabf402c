"""The survivors' memory as the checkpoint: a save at a peer's failure, from the ranks
that live through it.

Every replica of a data-parallel job holds the same weights and optimizer state, and a
training step is all or nothing on a survivor (:mod:`slurmtf.training.steps`). So when a
peer dies, freezes or stalls, each surviving rank knows the last step it completed and
holds exactly that state. The first survivor to claim that step (an exclusive
``claim-<step>`` file) writes it to ``<model_dir>/rescue/step-<step>.rank-<rank>``: into a
hidden folder first, renamed when complete, so a save cut short is never read. The next
start resumes from the newest rescue when it holds at least the last periodic checkpoint's
step (:func:`slurmtf.training.checkpoints.newest_state`), and the chief's next periodic
save removes the rescues it supersedes.

The files here are plain folders and names; only :func:`save` touches TensorFlow (through
the ``tf.train.Checkpoint`` it is given).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

RESCUE_DIR = "rescue"
PREFIX = "ckpt"  # the checkpoint's file prefix inside a rescue folder
_FOLDER = re.compile(r"step-(\d+)\.rank-(\d+)$")
_CLAIM = re.compile(r"claim-(\d+)$")


@dataclasses.dataclass(frozen=True)
class Rescue:
    """One complete rescue save: the step it holds and the rank that wrote it."""

    step: int
    rank: int
    folder: Path

    @property
    def prefix(self) -> str:
        """What ``tf.train.Checkpoint.restore`` reads."""
        return str(self.folder / PREFIX)

    @property
    def source(self) -> str:
        """Where the state came from, in words."""
        return f"rank {self.rank}'s memory"


def rescue_dir(model_dir: str | Path) -> Path:
    return Path(model_dir) / RESCUE_DIR


def found(model_dir: str | Path | None) -> list[Rescue]:
    """The complete rescues in ``model_dir``, oldest step first (lowest rank first)."""
    if model_dir is None:
        return []
    try:
        entries = list(rescue_dir(model_dir).iterdir())
    except OSError:
        return []
    saves = []
    for entry in entries:
        match = _FOLDER.match(entry.name)
        if match and (entry / f"{PREFIX}.index").exists():
            saves.append(Rescue(int(match.group(1)), int(match.group(2)), entry))
    return sorted(saves, key=lambda r: (r.step, -r.rank))


def newest(model_dir: str | Path | None) -> Rescue | None:
    """The rescue holding the highest step (of those, the lowest rank's), or None."""
    saves = found(model_dir)
    return saves[-1] if saves else None


def claim(model_dir: str | Path, step: int) -> bool:
    """True for the one caller that gets to write ``step`` (an exclusive create, which
    NFS v3+ and Lustre honour); False when another survivor has it."""
    folder = rescue_dir(model_dir)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(folder / f"claim-{step}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True


def save(
    checkpoint: Any, model_dir: str | Path, step: int, rank: int, saved: int | None = None
) -> Rescue | None:
    """Write ``checkpoint`` (a ``tf.train.Checkpoint``) as the rescue of ``step``, unless
    another survivor claimed that step first or the last periodic checkpoint (of step
    ``saved``) is newer (a rank that froze and thawed after the job went on without it),
    then None. Complete or absent: the files go to a hidden folder that is renamed into
    place."""
    if saved is not None and step < saved:
        return None
    if not claim(model_dir, step):
        return None
    final = rescue_dir(model_dir) / f"step-{step}.rank-{rank}"
    scratch = rescue_dir(model_dir) / f".step-{step}.rank-{rank}.{os.getpid()}"
    try:
        checkpoint.write(str(scratch / PREFIX))
        scratch.replace(final)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Rescue(step, rank, final)


def prune(model_dir: str | Path | None, upto: int) -> None:
    """Remove the rescues and claims of steps up to ``upto`` (a periodic save has them),
    and hidden folders a killed writer left more than an hour ago."""
    if model_dir is None:
        return
    try:
        entries = list(rescue_dir(model_dir).iterdir())
    except OSError:
        return
    now = time.time()
    for entry in entries:
        match = _FOLDER.match(entry.name) or _CLAIM.match(entry.name)
        stale = entry.name.startswith(".") and _age(entry, now) > 3600
        if (match and int(match.group(1)) <= upto) or stale:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()


def _age(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except OSError:
        return 0.0
