"""Following files as a step writes them: the event lines the ranks of each node append
to that node's file (through :func:`slurmtf.events.parse_events`, the one reader) and
srun's stderr, each from where the attempt started. Bounded: one open per file per look
(so per node, never per rank: 64 nodes x 16 ranks is 64 opens, not 1,024), no thread, at
most ``MAX_READ`` bytes per look and ``MAX_PARTIAL`` bytes of a line not yet ended.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path

from slurmtf.events import Event, parse_events

MAX_READ = 1 << 20
MAX_PARTIAL = 1 << 16


def sizes(paths: Iterable[Path]) -> dict[str, int]:
    """Where each file ends now (files that do not exist are left out)."""
    out = {}
    for path in paths:
        with contextlib.suppress(OSError):
            out[str(path)] = path.stat().st_size
    return out


def read_from(path: Path, offset: int, limit: int = MAX_READ) -> bytes:
    """Up to ``limit`` bytes of ``path`` from ``offset`` (b"" when it cannot be read)."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read(limit)
    except OSError:
        return b""


class EventFollower:
    """The event lines appended to the files ``files()`` lists at each look (the nodes'
    files of :mod:`slurmtf.events`), from the offsets noted before the step."""

    def __init__(self, files: Callable[[], Iterable[Path]], offsets: dict[str, int]) -> None:
        self.files = files
        self.offsets = dict(offsets)
        self.partial: dict[str, bytes] = {}

    def new_events(self) -> list[Event]:
        events: list[Event] = []
        for path in self.files():
            key = str(path)
            data = read_from(path, self.offsets.get(key, 0))
            if not data:
                continue
            self.offsets[key] = self.offsets.get(key, 0) + len(data)
            text = self.partial.pop(key, b"") + data
            complete, _, rest = text.rpartition(b"\n")
            if rest:
                self.partial[key] = rest[-MAX_PARTIAL:]
            events += parse_events(complete.decode(errors="replace"))
        return events


class Copier:
    """Copies what a command appends to ``path`` (srun's stderr) to ``write``."""

    def __init__(self, path: Path, offset: int, write: Callable[[bytes], object]) -> None:
        self.path, self.offset, self.write = path, offset, write

    def copy(self) -> None:
        data = read_from(self.path, self.offset)
        while data:
            self.offset += len(data)
            self.write(data)
            data = read_from(self.path, self.offset)
