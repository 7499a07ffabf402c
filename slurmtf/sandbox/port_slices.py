"""Which slice of the step-port window a new sandbox takes (``MpiParams=ports``).

Each slurmctld hands out ``srun --resv-ports`` from the bottom of its range, so two
sandboxes on one machine that share a range give their jobs the same ports at once, and
their ranks find them held. A sandbox prefers the slice its directory names
(:func:`slurmtf.sandbox.config.resv_port_range`) and takes the next one that no running
sandbox's slurmctld uses (read from their ``slurm.conf``), under one lock for the machine
while it chooses and starts (:func:`choosing`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

LOCK_FILE = Path("/tmp/slurmtf-sandbox-ports.lock")
MPI_PORTS = re.compile(r"^MpiParams=ports=(\d+)-(\d+)\s*$", re.MULTILINE)


def free_slice(preferred: int, used: Iterable[int], slices: int) -> int:
    """``preferred``, else the next slice (cyclically) not in ``used``; ``preferred`` when
    every slice is used."""
    taken = set(used)
    for offset in range(slices):
        candidate = (preferred + offset) % slices
        if candidate not in taken:
            return candidate
    return preferred


def slice_of(low: int, window_low: int, span: int) -> int:
    """The slice a range starting at ``low`` is."""
    return (low - window_low) // span


def running_ranges(proc: Path = Path("/proc")) -> list[tuple[int, int]]:
    """``MpiParams=ports`` of every running slurmctld started with ``-f CONF``."""
    ranges = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"slurmctld") or b"-f" not in argv[:-1]:
            continue
        conf = Path(os.fsdecode(argv[argv.index(b"-f") + 1]))
        with contextlib.suppress(OSError):
            ranges += [(int(a), int(b)) for a, b in MPI_PORTS.findall(conf.read_text())]
    return ranges


@contextlib.contextmanager
def choosing(lock_file: Path = LOCK_FILE) -> Iterator[None]:
    """Hold the machine's lock while a sandbox chooses its slice and starts slurmctld (no
    lock where the file cannot be opened: the choice is then only likely free)."""
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
