"""Pure parts of the soak tool: /proc reading, trends and the verdict (no Slurm, no TF)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from benchmarks.soak import Usage, rank_pids, read_usage, trend, verdict


def test_trend_of_a_flat_series_is_flat_and_warmup_is_left_out() -> None:
    times = [float(t) for t in range(0, 100, 5)]
    values = [500.0 if t < 30 else 120.0 for t in times]  # start-up spike, then flat
    flat = trend(times, values, warmup=30)
    assert flat["growth"] == 0
    assert flat["slope_per_hour"] == pytest.approx(0)
    assert flat["max"] == 120


def test_trend_measures_growth_and_slope_per_hour() -> None:
    times = [float(t) for t in range(0, 600, 10)]
    values = [100 + t for t in times]  # one per second
    grown = trend(times, values, warmup=0)
    assert grown["slope_per_hour"] == pytest.approx(3600)
    assert grown["growth"] > 400
    with pytest.raises(ValueError, match="at least 5 samples"):
        trend(times, values, warmup=10_000)


def _ranks(threads: float, fds: float, rss: float) -> dict[str, dict[str, dict[str, float]]]:
    return {
        "0": {
            "threads": {"growth": threads},
            "fds": {"growth": fds},
            "rss_kb": {"growth_fraction": rss},
        }
    }


@pytest.mark.parametrize(
    ("threads", "fds", "rss", "problem"),
    [
        (0, 0, 0.0, None),
        (8, 8, 0.049, None),
        (9, 0, 0.0, "threads grew by 9"),
        (0, 12, 0.0, "open fds grew by 12"),
        (0, 0, 0.06, "RSS grew by 6.0 %"),
    ],
)
def test_verdict_bounds(threads: float, fds: float, rss: float, problem: str | None) -> None:
    problems = verdict(_ranks(threads, fds, rss))
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1
        assert problem in problems[0]


def test_read_usage_sees_this_process_grow_a_thread() -> None:
    before = read_usage(os.getpid())
    assert isinstance(before, Usage)
    assert before.rss_kb > 1000
    assert before.fds >= 3
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        during = read_usage(os.getpid())
        assert during is not None
        assert during.threads == before.threads + 1
    finally:
        stop.set()
        worker.join()
    assert read_usage(2**22 + 12345) is None  # no such process


def test_rank_pids_finds_the_training_processes_of_one_job(tmp_path: Path) -> None:
    def fake(pid: int, cmd: list[str], env: dict[str, str]) -> None:
        entry = tmp_path / str(pid)
        entry.mkdir()
        (entry / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmd) + b"\0")
        (entry / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()))

    python = ["/usr/bin/python3", "-m", "models.mnist", "--train_steps=5"]
    fake(10, python, {"SLURM_JOB_ID": "7", "SLURM_PROCID": "1"})
    fake(11, python, {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"})
    fake(12, python, {"SLURM_JOB_ID": "8", "SLURM_PROCID": "0"})  # another job
    srun = ["srun", "--kill-on-bad-exit=1", "python3", "-m", "models.mnist"]
    fake(13, srun, {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"})  # the launcher
    fake(14, ["/bin/bash", "job.sbatch"], {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"})
    (tmp_path / "self").mkdir()
    assert rank_pids("7", proc=tmp_path) == {0: 11, 1: 10}
