"""The supervisor's side of its keeper's death, and the two processes' titles (Linux).

Slurm ends the job when the keeper, the batch step's main process, ends. A supervisor
whose keeper is killed lives on as an orphan for ``KillWait`` at most: right after the
fork it asks the kernel for :data:`KEEPER_GONE` at its parent's death
(``PR_SET_PDEATHSIG``) and checks ``getppid()`` once that is set (the keeper may be gone
already); :func:`keeper_gone` says when. The supervisor then requeues the job at once
(:meth:`slurmtf.runtime.supervisor.Supervisor.after_keeper`).

:func:`set_title` names each process in ``ps``: its ``comm`` through ``PR_SET_NAME``
(15 bytes) and its command line by overwriting the arguments' memory in place (their
original length at most: ``/proc/self/stat``'s ``arg_start``/``arg_end``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from pathlib import Path
from types import FrameType

KEEPER_GONE = int(signal.SIGRTMIN) + 1  # a real-time signal nobody else sends
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_COMM_BYTES = 15
_gone: list[float] = []  # when the keeper was seen gone (the signal or getppid)
_keeper: list[int] = []  # its pid


def _prctl(option: int, value: int | bytes) -> bool:
    with contextlib.suppress(OSError, AttributeError):
        return int(ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)) == 0
    return False


def watch_keeper(keeper: int) -> None:
    """In the forked supervisor, at once: :data:`KEEPER_GONE` when ``keeper`` dies."""
    _keeper[:] = [keeper]
    signal.signal(KEEPER_GONE, _on_gone)
    _prctl(_PR_SET_PDEATHSIG, KEEPER_GONE)
    if os.getppid() != keeper:  # gone before the kernel was asked
        _on_gone(KEEPER_GONE, None)


def keeper_gone() -> float | None:
    """When the keeper was seen gone (epoch seconds); None while it lives."""
    return _gone[0] if _gone else None


def watched_keeper() -> int:
    """The keeper's pid (0 in a process that watches none)."""
    return _keeper[0] if _keeper else 0


def _on_gone(_signum: int, _frame: FrameType | None) -> None:
    if not _gone:
        _gone.append(time.time())


def set_title(title: str, comm: str) -> None:
    """``ps -o args`` shows ``title`` (cut to the original command line's length), ``ps
    -o comm`` ``comm`` (cut to 15 bytes); either is left as it was where it cannot be
    changed."""
    _prctl(_PR_SET_NAME, comm.encode()[:_COMM_BYTES])
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
        size = end - start
        if size > 1:
            data = title.encode()[: size - 1]
            ctypes.memmove(start, data + b"\0" * (size - len(data)), size)
