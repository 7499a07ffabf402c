"""The supervisor's children: each srun step in a process group of its own, ended with
bounded waits (SIGTERM to the group, SIGKILL after a grace period), never left behind.

As torch.distributed.elastic's ``multiprocessing/api.py`` starts and stops its workers:
a child is a session leader (``start_new_session``), so that one ``killpg`` reaches srun
and anything it started on this node; :meth:`Child.stop` returns only when the group
is gone or ``KILL_WAIT_S`` passed after SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

GRACE_S = 5.0  # after SIGTERM, before SIGKILL
KILL_WAIT_S = 5.0  # after SIGKILL (a process in uninterruptible sleep may take a while)


class Child:
    """One command running in its own process group."""

    def __init__(
        self,
        args: Sequence[str],
        env: Mapping[str, str],
        *,
        stderr: Path | None = None,
        stdout: int | IO[bytes] | None = None,
    ) -> None:
        self.args = list(args)
        err = stderr.open("ab") if stderr is not None else None
        try:
            self.proc = subprocess.Popen(
                self.args, env=dict(env), stdin=subprocess.DEVNULL, stdout=stdout, stderr=err,
                start_new_session=True,
            )  # fmt: skip
        finally:
            if err is not None:
                err.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the child itself (srun forwards it to the step's tasks)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    def stop(self, grace: float = GRACE_S) -> int:
        """End the child and its group: SIGTERM, then SIGKILL after ``grace`` seconds
        (``grace`` 0: SIGKILL at once); its exit status (128+N for signal N)."""
        if grace > 0 and self.proc.poll() is None:
            _killpg(self.pid, signal.SIGTERM)
            _wait(self.proc, grace)
        _killpg(self.pid, signal.SIGKILL)
        _wait(self.proc, KILL_WAIT_S)
        return self.status()

    def status(self) -> int:
        code = self.proc.poll()
        if code is None:
            return 128 + signal.SIGKILL
        return 128 - code if code < 0 else code

    def reap(self) -> None:
        """After the child ended: whatever it left in its group goes too."""
        _killpg(self.pid, signal.SIGKILL)


def _killpg(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _wait(proc: subprocess.Popen[bytes], seconds: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=seconds)


def run_bounded(
    args: Sequence[str], env: Mapping[str, str], timeout: float, *, stderr: Path | None = None
) -> int:
    """Run a command of slurmtf's own (staging, a check) to its end within ``timeout``
    seconds; past it, its group is ended. Its exit status."""
    child = Child(args, env, stderr=stderr)
    deadline = time.monotonic() + timeout
    while child.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout=min(1.0, max(deadline - time.monotonic(), 0.01)))
    if child.poll() is None:
        return child.stop()
    child.reap()
    return child.status()
