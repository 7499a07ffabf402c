"""The job's log: the batch script's stdout and stderr, which its keeper, its supervisor
and the supervisor's steps write to, and to which the watcher adds its lines from
another node. Each line is ``<time> slurmtf: text`` (:func:`line`), its time as the job's
log writes times (:func:`now`, :func:`stamp`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from datetime import datetime
from pathlib import Path


def now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


def stamp(seconds: float) -> str:
    """An epoch time as the job's log writes times (ISO 8601, local zone, seconds)."""
    return datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="seconds")


def line(text: str) -> str:
    """One line of the job's log, without its newline: ``<time> slurmtf: text``."""
    return f"{now()} slurmtf: {text}"


def log(text: str, *, error: bool = False) -> None:
    """One line of the job's log (stderr for ``error``), flushed at once."""
    print(line(text), file=sys.stderr if error else sys.stdout, flush=True)


def plain(text: str) -> None:
    """A line without the ``slurmtf:`` tag (the job's header, ``srun exited N``)."""
    print(f"{now()} {text}", flush=True)


def to_stderr(data: bytes) -> None:
    """What a step's srun wrote, copied as it is to the job's log (its stderr)."""
    sys.stderr.buffer.write(data)
    sys.stderr.buffer.flush()


def stdout_file() -> Path | None:
    """The job's log (the batch script's stdout, a file Slurm opened), to which the
    watcher adds its lines; ``None`` when stdout is no file."""
    try:
        path = Path(f"/proc/{os.getpid()}/fd/1").readlink()
    except OSError:
        return None
    return path if path.is_absolute() and path.is_file() else None


def append(path: Path, text: str) -> None:
    """Add a line to the job's log from another process (the watcher, on another node);
    a file system error is not the job's."""
    with contextlib.suppress(OSError), path.open("a") as handle:
        handle.write(text + "\n")
