"""Preemption: on the configured signal every rank saves at the same step and exits 75.

Slurm sends the signal (``--signal=USR2@60``) to each task at slightly different
times. The handler only raises a local flag; the flag travels with the loss in the
all-reduce of every train step, so all ranks learn of it after the same step, save one
checkpoint together and exit with ``EX_TEMPFAIL`` (75) for the requeue.
"""

from __future__ import annotations

import signal
from types import FrameType

from absl import logging

from slurmtf.contracts import EXIT_PREEMPTED, parse_preemption_signal


class PreemptionWatcher:
    """Installs a handler for one signal; ``requested`` turns true when it arrives."""

    def __init__(self, signame: str = "USR2") -> None:
        self.signum = parse_preemption_signal(signame)
        self.requested = False
        self._previous: object = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if not self.requested:
            logging.warning(
                "Received %s: will checkpoint and exit %d",
                signal.Signals(signum).name,
                EXIT_PREEMPTED,
            )
        self.requested = True

    def install(self) -> PreemptionWatcher:
        """Handle the signal from now on; calling it again re-takes the signal (TensorFlow
        installs its own SIGTERM handler when a multi-worker runtime starts)."""
        previous = signal.signal(self.signum, self._handle)
        if self._previous is None:
            self._previous = previous
        return self

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(self.signum, self._previous)  # type: ignore[arg-type]
            self._previous = None
