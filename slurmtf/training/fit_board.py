"""The allocation run for ``model.fit`` scripts: what :mod:`.allocation` writes for the
bundled models, from a Keras callback's hooks (:class:`slurmtf.fit.AllocationBoard`).

Written by the chief alone into ``<folder>/allocation`` (``folder``: the callback's
argument, else ``MODEL_DIR``, which the job scripts and ``slurmtf submit`` export):

* at each start, its number and the steps it computes again, and every restart,
  requeue and preemption of the job's recovery record not written before, with its cause
  and what it cost (:meth:`.allocation.Board.at_start`);
* once per window of ``every_s`` seconds: steps and examples per second (examples when
  the global batch is known), the job's goodput (steps and time), and the node's GPUs
  where ``nvidia-smi`` answers.

``fit``'s step is Keras's own, so no rank's compute and wait time can be told apart here:
those, and the straggler, come from slurmtf's own training loop. One point per window,
never per step: bounded over a day's run like the bundled models' run. Imports
TensorFlow only through the writer it is given.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

from slurmtf.training.allocation import (
    STATE_NAME,
    Board,
    Writer,
    job_log_dirs,
    recovery_records,
)
from slurmtf.training.gpu_query import GpuProbe

EVERY_S = 30.0  # seconds a window lasts, as the bundled models' --timing_every


def board_folder(folder: str | None, environ: Mapping[str, str]) -> str | None:
    """Where the allocation run goes: ``folder``, else ``MODEL_DIR``; None: nowhere."""
    return folder or environ.get("MODEL_DIR") or None


class FitBoard:
    """One ``fit`` of the chief: the board opened at its start, a window every
    ``every_s`` seconds of its batches, the last window at its end."""

    def __init__(
        self,
        board: Board,
        *,
        every_s: float = EVERY_S,
        global_batch: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.board = board
        self.every_s = every_s
        self.global_batch = global_batch
        self._clock, self._wall = clock, wall
        self._since = (0.0, 0)

    @classmethod
    def open(
        cls,
        folder: str,
        writer: Writer,
        environ: Mapping[str, str],
        step: int,
        **options: object,
    ) -> FitBoard:
        """The board on ``folder`` (``writer`` writes its summaries), this start written."""
        Path(folder).mkdir(parents=True, exist_ok=True)
        board = Board(writer, Path(folder) / STATE_NAME, 0, GpuProbe())
        job_id = environ.get("SLURM_JOB_ID")
        records = recovery_records(job_id, job_log_dirs(job_id, environ.get("LOG_DIR")))
        restart = int(environ.get("SLURM_RESTART_COUNT") or 0)
        board.at_start(step, restart, records, time.time())
        fit = cls(board, **options)  # type: ignore[arg-type]
        fit.started(step)
        return fit

    def started(self, step: int) -> None:
        self._since = (self._clock(), step)

    def batch_end(self, step: int) -> None:
        """After a batch: a window once ``every_s`` seconds have passed."""
        if self._clock() - self._since[0] >= self.every_s:
            self.window(step)

    def window(self, step: int) -> None:
        """The window since the last one, if a step was trained in it."""
        began, first = self._since
        seconds, steps = self._clock() - began, step - first
        if steps <= 0 or seconds <= 0:
            return
        rates = {"allocation/steps_per_sec": steps / seconds}
        if self.global_batch:
            rates["allocation/examples_per_sec"] = steps * self.global_batch / seconds
        self.board.window(step, [], [], seconds=seconds, steps=steps, now=self._wall(), extra=rates)
        self._since = (self._clock(), step)

    def close(self, step: int) -> None:
        self.window(step)
        self.board.close()
