"""Which processes are still alive: what tests check after something ought to end them."""

from __future__ import annotations

import os
from pathlib import Path

from slurmtf.sandbox.daemons import cmdline, is_zombie


def pids_mentioning(text: str) -> list[int]:
    """Live processes but this one whose command line contains ``text`` (a sandbox's
    directory, a test's marker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            pid = int(entry.name)
            if text in cmdline(pid) and not is_zombie(pid):
                found.append(pid)
    return sorted(found)


def children_of(pid: int) -> list[tuple[int, str]]:
    """The live children of ``pid`` (every thread's), each with its command line."""
    found = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            if not is_zombie(child):
                found.append((child, cmdline(child)))
    return found
