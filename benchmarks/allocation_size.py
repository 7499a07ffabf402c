"""Bytes of the chief's allocation summaries (``<model_dir>/allocation``) over a day.

The real writer (:class:`slurmtf.training.export.AllocationWriter`, TensorFlow's event
file) is fed a day's timing windows at ``--timing_every`` (default 30 s: 2,880 windows)
for each rank count, with a straggler reported and recovered every 100 windows, a GPU
per rank (its row of the step's all-reduce carries it), and one start with 10 recovery
lines. ``uncapped`` is the same with
a scalar pair for every rank (what :data:`~slurmtf.training.allocation.MAX_RANK_SCALARS`
prevents), measured over ``--uncapped_windows`` windows and scaled to the day (the bytes
grow linearly with the windows).

    python -m benchmarks.allocation_size [--ranks 8,1024] [--hours 24] [--timing_every 30]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from slurmtf.check.stragglers import Finding, RankSample, Report
from slurmtf.training import allocation


def measure(ranks: int, windows: int, capped: bool) -> tuple[int, float]:
    """Bytes of the event files after ``windows`` windows at ``ranks`` ranks; seconds."""
    from slurmtf.training.export import AllocationWriter

    with tempfile.TemporaryDirectory() as folder:
        board = allocation.Board(AllocationWriter(folder), Path(folder) / allocation.STATE_NAME)
        if not capped:
            board.max_ranks = ranks
        records = [{"time": i, "attempt": i, "action": "restart", "why": "x" * 80}
                   for i in range(10)]  # fmt: skip
        board.at_start(0, 0, records, now=0.0)
        gpu = (90.0, 30000.0, 40960.0)
        samples = [RankSample(r, f"n{r}", 0.1 + r * 1e-6, 0.05, gpu=gpu) for r in range(ranks)]
        finding = Finding(3, "n3", "compute", 0.3, "compute 300 ms a step, 3.0x the median")
        started = time.monotonic()
        for window in range(windows):
            event = ("straggler", "straggler_recovered")[window // 100 % 2]
            reports = [Report(event, finding, 0.0)] if window % 100 == 0 else []
            board.window(window * 100, samples, reports, seconds=30.0, steps=100, now=window * 30.0)
        seconds = time.monotonic() - started
        size = sum(p.stat().st_size for p in Path(folder).rglob("events.out.*"))
    return size, seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="8,1024", help="rank counts (default 8,1024)")
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--timing_every", type=float, default=30.0)
    parser.add_argument("--uncapped_windows", type=int, default=20)
    args = parser.parse_args(argv)
    windows = int(args.hours * 3600 / args.timing_every)
    for ranks in (int(r) for r in args.ranks.split(",")):
        for capped in (True, False):
            measured = windows if capped else min(args.uncapped_windows, windows)
            size, seconds = measure(ranks, measured, capped)
            row = {"ranks": ranks, "windows": windows, "capped": capped,
                   "bytes": int(size * windows / measured), "measured_windows": measured,
                   "write_s_per_window": round(seconds / measured, 5)}  # fmt: skip
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
