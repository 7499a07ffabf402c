"""glibc malloc settings that keep a long training process's resident memory flat.

A TensorFlow rank frees as much as it allocates, but glibc keeps freed memory in its
arenas (up to 8 per core, one picked per thread) instead of returning it: on a 2-core
machine a 2-worker MNIST rank's free-but-kept heap grew from ~100 to ~155 MB over 1,000
steps while the memory in use stayed at ~170 MB, and RSS followed the free heap
(docs/SOAK.md). :func:`limit_arenas` caps the number of arenas (``M_ARENA_MAX``), as
``MALLOC_ARENA_MAX`` would: the free heap then stays at 20-60 MB and RSS stops climbing.
``malloc_trim(0)`` after every evaluation was measured too and did not stop the climb
(the kept memory is fragmented, not whole free pages), so it is not used.

With the cap, a rank's anonymous memory still rose and fell in a sawtooth: 10-30 MB
built up over ~2,000 steps and went back at once, on every rank at the same step
(glibc's trim threshold follows the largest block freed, up to 64 MiB, so free memory
at the top of an arena is kept until it passes that). :func:`fix_thresholds` fixes the
thresholds instead (``mallopt``, as ``MALLOC_TRIM_THRESHOLD_`` and friends would).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any

M_ARENA_MAX = -8  # glibc's mallopt parameter numbers
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
DEFAULT_ARENAS = 2
# Fixed thresholds instead of glibc's moving ones (which follow the largest freed block up
# to a 64 MiB trim threshold): free memory at the top of an arena is given back once it
# passes TRIM_THRESHOLD, down to TOP_PAD; blocks from MMAP_THRESHOLD up are mapped apart.
TRIM_THRESHOLD, TOP_PAD, MMAP_THRESHOLD = 8 << 20, 4 << 20, 16 << 20
THRESHOLD_VARIABLES = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_",
                       "GLIBC_TUNABLES")  # fmt: skip


@functools.cache
def _libc() -> Any:
    """glibc, or ``None`` (another C library, or none found)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
    except OSError:
        return None
    if not all(hasattr(libc, f) for f in ("mallopt", "malloc_trim", "gnu_get_libc_version")):
        return None
    return libc


def limit_arenas(arenas: int = DEFAULT_ARENAS, env: dict[str, str] | None = None) -> bool:
    """Cap glibc's malloc arenas at ``arenas`` unless ``MALLOC_ARENA_MAX`` is set.

    Call early, before TensorFlow starts its thread pools (threads that already took an
    arena keep it). Returns whether the cap was applied.
    """
    source = os.environ if env is None else env
    libc = _libc()
    if libc is None or source.get("MALLOC_ARENA_MAX"):
        return False
    return bool(libc.mallopt(M_ARENA_MAX, arenas))


def fix_thresholds(env: dict[str, str] | None = None) -> bool:
    """Give free memory at the top of an arena back from ``TRIM_THRESHOLD`` on, unless
    the job sets glibc's own thresholds. Returns whether the thresholds were set."""
    source = os.environ if env is None else env
    libc = _libc()
    if libc is None or any(source.get(name) for name in THRESHOLD_VARIABLES):
        return False
    return all(
        libc.mallopt(param, value)
        for param, value in (
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (M_TOP_PAD, TOP_PAD),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        )
    )


def tune(env: dict[str, str] | None = None) -> None:
    """Both settings of this module, for a training process's start."""
    limit_arenas(env=env)
    fix_thresholds(env)
