"""Preemption: on the configured signal every rank saves at the same step and exits 75.

Slurm sends the signal (``--signal=USR2@60``) to each task at slightly different
times. The handler only raises a local flag; the flag travels with the loss in the
all-reduce of every train step, so all ranks learn of it after the same step, save one
checkpoint together and exit with ``EX_TEMPFAIL`` (75) for the requeue.

SIGTERM (a step ended: srun after a task failed, ``scancel``) is held too, unless it is
the preemption signal. The signal's arrival is read by a thread from Python's wakeup fd,
since the main thread may wait inside a collective whose peer is gone; the thread calls
``on_term`` (the training loop: abort this rank's collectives), so the step in flight
fails at once. The rank saves the step it holds from memory (slurmtf.training.rescue)
and then ends by SIGTERM as before, within Slurm's ``KillWait``.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

from absl import logging

from slurmtf.contracts import EXIT_PREEMPTED, parse_preemption_signal


class PreemptionWatcher:
    """Installs a handler for one signal; ``requested`` turns true when it arrives."""

    def __init__(self, signame: str = "USR2", on_term: Callable[[], None] | None = None) -> None:
        self.signum = parse_preemption_signal(signame)
        self.requested = False
        self.terminating = False  # SIGTERM arrived (held until the step ends)
        self.on_term = on_term
        self._previous: object = None
        self._previous_term: object = None
        self._wakeup: tuple[int, int] | None = None

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
            self._watch_term()
        return self

    def _watch_term(self) -> None:
        """Start the thread that sees SIGTERM while the main thread waits in TensorFlow."""
        if self._wakeup is not None or threading.current_thread() is not threading.main_thread():
            return
        read, write = os.pipe()
        os.set_blocking(write, False)
        try:
            signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError:  # not the main thread of the main interpreter
            os.close(read)
            os.close(write)
            return
        self._wakeup = (read, write)
        threading.Thread(target=self._read_wakeup, args=(read,), name="slurmtf-sigterm",
                         daemon=True).start()  # fmt: skip

    def _read_wakeup(self, read: int) -> None:
        while True:
            try:
                signums = os.read(read, 64)
            except OSError:
                signums = b""
            if not signums:  # uninstall closed the pipe's other end
                os.close(read)
                return
            if signal.SIGTERM in signums and self.on_term is not None:
                self.terminating = True
                try:
                    self.on_term()
                except Exception as exc:  # the main thread still ends at its step's end
                    logging.warning("On SIGTERM: %s", exc)

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(self.signum, self._previous)  # type: ignore[arg-type]
            self._previous = None
        if self._previous_term is not None:
            signal.signal(signal.SIGTERM, self._previous_term)  # type: ignore[arg-type]
            self._previous_term = None
        if self._wakeup is not None:
            signal.set_wakeup_fd(-1)
            os.close(self._wakeup[1])  # the reading thread sees the end and closes its end
            self._wakeup = None

    def end_if_terminating(self) -> None:
        """End this process by SIGTERM, as the held signal would have, if it came."""
        if self.terminating:
            self.uninstall()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
