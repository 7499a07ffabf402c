"""Claims on this machine's local ports, so that steps started at once do not pick the
same free ports (edge: a lock file).

A base found free is free only until its ranks bind it, which for a sandbox job is tens of
seconds later; two steps started in that window could both find it free. Each base handed
out is therefore claimed in a shared file (one ``base count until`` line each, under an
exclusive ``flock``) for :data:`CLAIM_S`, and later picks from any process skip it. Where
the file cannot be used, the claims of this process alone are kept.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CLAIMS_FILE = Path(tempfile.gettempdir()) / "slurmtf-port-claims"
CLAIM_S = 3600.0


@dataclass(frozen=True)
class Claim:
    """Ports ``base .. base + count - 1`` taken until ``until`` (epoch seconds)."""

    base: int
    count: int
    until: float

    def overlaps(self, base: int, count: int) -> bool:
        return base < self.base + self.count and self.base < base + count

    def line(self) -> str:
        return f"{self.base} {self.count} {self.until:.0f}\n"


def parse_claims(text: str, now: float) -> list[Claim]:
    """The claims of ``text`` still live at ``now``; lines that do not parse are dropped."""
    claims = []
    for line in text.splitlines():
        fields = line.split()
        try:
            claim = Claim(int(fields[0]), int(fields[1]), float(fields[2]))
        except (IndexError, ValueError):
            continue
        if claim.until > now:
            claims.append(claim)
    return claims


_OWN: list[Claim] = []  # this process's claims, used when the file cannot be


@contextmanager
def held_claims(path: Path | None = None) -> Iterator[list[Claim]]:
    """The live claims of ``path`` (default :data:`CLAIMS_FILE`), locked against other
    processes; what the caller appends is kept."""
    now = time.time()
    try:
        fd = os.open(path or CLAIMS_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        _OWN[:] = [c for c in _OWN if c.until > now]
        yield _OWN
        return
    with os.fdopen(fd, "r+") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        claims = parse_claims(file.read(), now)
        yield claims
        file.seek(0)
        file.truncate()
        file.write("".join(claim.line() for claim in claims))
