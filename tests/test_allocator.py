"""The glibc arena cap (slurmtf.allocator): applied, and left to MALLOC_ARENA_MAX when set."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slurmtf import allocator

GLIBC = allocator._libc() is not None


@pytest.mark.skipif(not GLIBC, reason="not glibc")
def test_an_explicit_malloc_arena_max_wins() -> None:
    assert allocator.limit_arenas(env={"MALLOC_ARENA_MAX": "4"}) is False


@pytest.mark.skipif(not GLIBC, reason="not glibc")
def test_the_cap_bounds_the_arenas_threads_get() -> None:
    # 16 threads allocating at once: with the cap they share 2 arenas, without it each
    # may get its own (glibc allows 8 per core). malloc_stats() prints one block per arena.
    script = """
import sys, threading
from slurmtf import allocator
if sys.argv[1] == "cap":
    assert allocator.limit_arenas(2, env={})
start = threading.Barrier(16)
def work():
    start.wait()
    blocks = [bytearray(1000) for _ in range(20000)]
    del blocks
threads = [threading.Thread(target=work) for _ in range(16)]
for t in threads: t.start()
for t in threads: t.join()
allocator._libc().malloc_stats()
"""

    def arenas(mode: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", script, mode], capture_output=True, text=True, check=True
        )
        return done.stderr.count("Arena ")

    capped = arenas("cap")
    assert 1 <= capped <= 2
    assert arenas("default") > capped
