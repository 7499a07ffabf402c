"""Where a training process's memory goes: RSS, the native heap and Python objects per phase.

    MEMPROBE_OUT=/tmp/probe.jsonl python -m benchmarks.memprobe mnist --train_steps=3000 \
        --epochs_between_evals=1 --log_every=1000000

Runs ``models.<model>`` in this process (a rank of a local step when the Slurm/TF_CONFIG
environment says so) and, after every evaluation and every checkpoint save, appends one
JSON line to ``$MEMPROBE_OUT``: the step, the phase, ``VmRSS``, glibc's heap statistics
(``mallinfo2``: bytes in use, free bytes kept, mmapped bytes), Python's traced memory
(``MEMPROBE_TRACEMALLOC=1``: the top lines grown since the first record), the number of
live Python objects, the collections per generation and the concrete functions of the
eval step; around every full (generation 2) collection one ``gc2`` line: RSS and heap
before and after, and the unreachable objects it freed. ``MEMPROBE_TRIM=1``
calls ``malloc_trim(0)`` before each record, to tell memory the allocator keeps free
from memory in use.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import importlib
import json
import os
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
            "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


_LIBC = ctypes.CDLL("libc.so.6")


def heap() -> dict[str, int]:
    """glibc's ``mallinfo2``: in use (``uordblks``), kept free (``fordblks``), mmapped."""
    _LIBC.mallinfo2.restype = _MallInfo2
    info = _LIBC.mallinfo2()
    return {"in_use": info.uordblks, "free": info.fordblks, "mmapped": info.hblkhd}


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Probe:
    """Appends one record per hooked phase to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.t0 = time.monotonic()
        self.trace = os.environ.get("MEMPROBE_TRACEMALLOC") == "1"
        self.trim = os.environ.get("MEMPROBE_TRIM") == "1"
        self.baseline: Any = None
        self._before: dict[str, int] = {}
        if self.trace:
            tracemalloc.start(8)
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        """Around every full (generation 2) collection: RSS and heap before and after, and
        how many objects it found unreachable (garbage in reference cycles)."""
        if info["generation"] != 2:
            return
        if phase == "start":
            self._before = {"rss_kb": rss_kb(), **heap()}
            return
        after = {"rss_kb": rss_kb(), **heap()}
        row = {"t": round(time.monotonic() - self.t0, 2), "phase": "gc2",
               "collected": info["collected"],
               **{f"{k}_before": v for k, v in self._before.items()}, **after}  # fmt: skip
        with Path(self.path).open("a") as out:
            out.write(json.dumps(row) + "\n")

    def record(self, phase: str, step: int, training: Any) -> None:
        if self.trim:
            _LIBC.malloc_trim(0)
        row: dict[str, Any] = {
            "t": round(time.monotonic() - self.t0, 2),
            "phase": phase,
            "step": step,
            "rss_kb": rss_kb(),
            **heap(),
            "py_objects": len(gc.get_objects()),
            "gc_collections": [g["collections"] for g in gc.get_stats()],
            "eval_functions": _concrete_count(training.steps.eval_step),
            "train_functions": _concrete_count(training.steps.train_step),
        }
        if self.trace:
            snap = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
            row["py_traced"] = tracemalloc.get_traced_memory()[0]
            if self.baseline is None:
                self.baseline = snap
            else:
                row["py_top"] = [
                    f"{s.size_diff:+d} B {s.count_diff:+d} {s.traceback.format()[-1].strip()}"
                    for s in snap.compare_to(self.baseline, "lineno")[:6]
                ]
        with Path(self.path).open("a") as out:
            out.write(json.dumps(row) + "\n")


def _concrete_count(function: Any) -> int:
    try:
        return len(function._list_all_concrete_functions())
    except Exception:  # a probe never breaks the run
        return -1


def _hooked(probe: Probe, phase: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: Any, step: int, *args: Any, **kwargs: Any) -> Any:
        result = method(self, step, *args, **kwargs)
        probe.record(phase, step, self)
        return result

    return wrapper


def main(argv: list[str]) -> int:
    from slurmtf.training.phases import Training

    probe = Probe(os.environ.get("MEMPROBE_OUT", f"/tmp/memprobe-{os.getpid()}.jsonl"))
    Training.evaluate = _hooked(probe, "eval", Training.evaluate)  # type: ignore[method-assign]
    Training.save = _hooked(probe, "save", Training.save)  # type: ignore[method-assign]
    model = importlib.import_module(f"models.{argv[0]}")
    code: int = model.main(argv[1:])
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
