"""The glibc arena cap (slurmtf.runtime.rank.allocator): applied, or left to MALLOC_ARENA_MAX."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slurmtf.runtime.rank import allocator

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
from slurmtf.runtime.rank import allocator
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


@pytest.mark.skipif(not GLIBC, reason="not glibc")
def test_fixed_thresholds_give_freed_memory_back() -> None:
    # One 30 MiB block freed moves glibc's own thresholds up (mmap 30 MiB, trim 60 MiB):
    # 40 MiB of 1 MiB blocks freed afterwards then stay resident. With the fixed
    # thresholds everything above the 4 MiB pad goes back.
    script = """
import ctypes, sys
from slurmtf.runtime.rank import allocator
libc = allocator._libc()
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "fixed":
    assert allocator.fix_thresholds(env={})
def anon_kb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
big = libc.malloc(30 << 20); ctypes.memset(big, 1, 30 << 20); libc.free(big)
before = anon_kb()
blocks = [libc.malloc(1 << 20) for _ in range(40)]
for b in blocks:
    ctypes.memset(b, 1, 1 << 20)
for b in reversed(blocks):
    libc.free(b)
print((anon_kb() - before) // 1024)
"""

    def kept_mib(mode: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", script, mode], capture_output=True, text=True, check=True
        )
        return int(done.stdout.split()[-1])

    assert kept_mib("default") >= 30
    assert kept_mib("fixed") <= 8
    assert allocator.fix_thresholds(env={"MALLOC_TRIM_THRESHOLD_": "131072"}) is False
