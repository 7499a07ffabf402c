"""Preemption: on the configured signal every rank saves at the same step and exits 75.

Slurm sends the signal (``--signal=USR2@60``) to each task at slightly different
times. The handler only raises a local flag; the flag travels with the loss in the
all-reduce of every train step, so all ranks learn of it after the same step, save one
checkpoint together and exit with ``EX_TEMPFAIL`` (75) for the requeue.

SIGTERM (a step ended: srun after a task failed, ``scancel``) is held too, unless it is
the preemption signal: the rank finishes the step it is in, saves from memory when a
peer's failure broke that step (slurmtf.training.rescue), and then ends by SIGTERM as
before, within Slurm's ``KillWait``.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

from absl import logging

from slurmtf.contracts import EXIT_PREEMPTED, parse_preemption_signal


class PreemptionWatcher:
    """Installs a handler for one signal; ``requested`` turns true when it arrives."""

    def __init__(self, signame: str = "USR2") -> None:
        self.signum = parse_preemption_signal(signame)
        self.requested = False
        self.terminating = False  # SIGTERM arrived (held until the step ends)
        self._previous: object = None
        self._previous_term: object = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if not self.requested:
            logging.warning(
                "Received %s: will checkpoint and exit %d",
                signal.Signals(signum).name,
                EXIT_PREEMPTED,
            )
        self.requested = True

    def _hold_term(self, signum: int, frame: FrameType | None) -> None:
        del signum, frame
        self.terminating = True

    def install(self) -> PreemptionWatcher:
        """Handle the signal from now on; calling it again re-takes the signal (TensorFlow
        installs its own SIGTERM handler when a multi-worker runtime starts)."""
        previous = signal.signal(self.signum, self._handle)
        if self._previous is None:
            self._previous = previous
        if self.signum != signal.SIGTERM:
            previous = signal.signal(signal.SIGTERM, self._hold_term)
            if self._previous_term is None:
                self._previous_term = previous
        return self

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(self.signum, self._previous)  # type: ignore[arg-type]
            self._previous = None
        if self._previous_term is not None:
            signal.signal(signal.SIGTERM, self._previous_term)  # type: ignore[arg-type]
            self._previous_term = None

    def end_if_terminating(self) -> None:
        """End this process by SIGTERM, as the held signal would have, if it came."""
        if self.terminating:
            self.uninstall()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
