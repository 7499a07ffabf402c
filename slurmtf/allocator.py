"""glibc malloc settings that keep a long training process's resident memory flat.

A TensorFlow rank frees as much as it allocates, but glibc keeps freed memory in its
arenas (up to 8 per core, one picked per thread) instead of returning it: on a 2-core
machine a 2-worker MNIST rank's free-but-kept heap grew from ~100 to ~155 MB over 1,000
steps while the memory in use stayed at ~170 MB, and RSS followed the free heap
(docs/SOAK.md). :func:`limit_arenas` caps the number of arenas (``M_ARENA_MAX``), as
``MALLOC_ARENA_MAX`` would: the free heap then stays at 20-60 MB and RSS stops climbing.
``malloc_trim(0)`` after every evaluation was measured too and did not stop the climb
(the kept memory is fragmented, not whole free pages), so it is not used.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any

M_ARENA_MAX = -8  # glibc's mallopt parameter number
DEFAULT_ARENAS = 2


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
