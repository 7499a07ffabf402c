"""The job log's lines (the batch script's stdout and stderr): ``<time> slurmtf: text``."""

from __future__ import annotations

import sys
from datetime import datetime


def now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


def stamp(seconds: float) -> str:
    """An epoch time as the job's log writes times (ISO 8601, local zone, seconds)."""
    return datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="seconds")


def log(text: str, *, error: bool = False) -> None:
    """One line of the job's log (stderr for ``error``), flushed at once."""
    print(f"{now()} slurmtf: {text}", file=sys.stderr if error else sys.stdout, flush=True)


def plain(text: str) -> None:
    """A line without the ``slurmtf:`` tag (the job's header, ``srun exited N``)."""
    print(f"{now()} {text}", flush=True)
