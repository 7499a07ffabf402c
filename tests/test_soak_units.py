"""Pure parts of the soak tool: /proc reading (benchmarks.harness), trends and the verdict
(no Slurm, no TF)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from benchmarks.harness import Usage, rank_pids, read_usage
from benchmarks.soak import (
    CI_MAX_RSS_SLOPE_MB_H,
    MAX_RSS_SLOPE_MB_H,
    judged_window,
    rejudge,
    trend,
    verdict,
)


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


def test_the_judged_window_follows_the_first_evaluation_unless_it_came_late() -> None:
    samples = [{"t": float(t)} for t in range(0, 180, 3)]
    # An early evaluation: from the end of its own warm-up (45 s) to the end.
    assert judged_window(samples, 45.0, 60.0, 45.0) == (105.0, float("inf"))
    # No evaluation in the run: from the warm-up to the end.
    assert judged_window(samples, 45.0, None, 45.0) == (45.0, float("inf"))
    # One at 171 s of 180 (a slow machine): the training before it, 42 samples, not 2.
    assert judged_window(samples, 45.0, 171.0, 45.0) == (45.0, 171.0)
    # One mid-run at 105 s (an idle machine): 10 settled samples after 150 s against 20
    # before it, so the training before it; the memory its buffers take while they fill
    # (+19 MB over the next minute, measured) is no growth.
    assert judged_window(samples, 45.0, 105.0, 45.0) == (45.0, 105.0)
    values = [100.0 if s["t"] < 171 else 140.0 for s in samples]  # eval threads start
    judged = trend([s["t"] for s in samples], values, 45.0, until=171.0)
    assert judged["growth"] == 0


def _ranks(
    threads: float, fds: float, rss: float, rss_slope_mb_h: float = 0.0
) -> dict[str, dict[str, dict[str, float]]]:
    return {
        "0": {
            "threads": {"growth": threads},
            "fds": {"growth": fds},
            "rss_kb": {"growth_fraction": rss, "last_half_slope_per_hour": rss_slope_mb_h * 1024},
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


@pytest.mark.parametrize(
    ("slope", "limit", "problem"),
    [
        (24.0, MAX_RSS_SLOPE_MB_H, None),
        (-300.0, MAX_RSS_SLOPE_MB_H, None),
        (26.0, MAX_RSS_SLOPE_MB_H, "RSS still rising at +26 MB/h"),
        (700.0, CI_MAX_RSS_SLOPE_MB_H, None),
        (1700.0, CI_MAX_RSS_SLOPE_MB_H, "RSS still rising at +1700 MB/h"),
    ],
)
def test_verdict_bounds_the_last_half_rss_slope(
    slope: float, limit: float, problem: str | None
) -> None:
    problems = verdict(_ranks(0, 0, 0.0, slope), limit)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1
        assert problem in problems[0]


def _rss_series(
    minutes: float, warmup_mb: float, mb_per_hour: float
) -> tuple[list[float], list[float]]:
    """RSS samples (kB) every 5 s: a start-up climb of ``warmup_mb`` that levels off in
    the first tenth of the run, then a steady ``mb_per_hour``, with +-1.5 MB of noise."""
    times = [float(t) for t in range(0, int(minutes * 60), 5)]
    settle = minutes * 6
    values = []
    for i, t in enumerate(times):
        climb = warmup_mb * min(t, settle) / settle
        noise = 1.5 * ((i * 7919) % 11 - 5) / 5
        values.append((900 + climb + mb_per_hour * t / 3600 + noise) * 1024)
    return times, values


def _rss_verdict(times: list[float], values: list[float], limit: float) -> list[str]:
    flat = {"growth": 0.0}
    rss = trend(times, values, warmup=120)
    return verdict({"0": {"threads": flat, "fds": flat, "rss_kb": rss}}, limit)


def test_slow_growth_hidden_in_a_small_total_fails_on_its_last_half_slope() -> None:
    # 30 minutes at +60 MB/h: +2.7 % in total (under the 5 % bound), but still rising.
    times, values = _rss_series(30, warmup_mb=10, mb_per_hour=60)
    rss = trend(times, values, warmup=120)
    assert rss["growth_fraction"] < 0.05
    assert rss["last_half_slope_per_hour"] / 1024 == pytest.approx(60, abs=10)
    problems = _rss_verdict(times, values, MAX_RSS_SLOPE_MB_H)
    assert len(problems) == 1
    assert "still rising" in problems[0]


def test_settling_then_flat_passes_the_last_half_slope() -> None:
    # A climb that levels off during the first half, then flat: the whole-run slope is
    # positive, the last half's is not.
    times, values = _rss_series(30, warmup_mb=40, mb_per_hour=0)
    rss = trend(times, values, warmup=60)
    assert rss["slope_per_hour"] > rss["last_half_slope_per_hour"]
    assert _rss_verdict(times, values, MAX_RSS_SLOPE_MB_H) == []
    assert _rss_verdict(*_rss_series(30, warmup_mb=0, mb_per_hour=15), MAX_RSS_SLOPE_MB_H) == []


def test_ci_bound_passes_a_noisy_flat_3_minutes_and_fails_the_collective_leak() -> None:
    assert _rss_verdict(*_rss_series(3, warmup_mb=5, mb_per_hour=0), CI_MAX_RSS_SLOPE_MB_H) == []
    leak = _rss_verdict(*_rss_series(3, warmup_mb=5, mb_per_hour=1800), CI_MAX_RSS_SLOPE_MB_H)
    assert any("still rising" in p for p in leak)


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


def test_read_usage_splits_rss_into_anonymous_and_file_pages() -> None:
    usage = read_usage(os.getpid())
    assert usage is not None
    assert usage.anon_kb > 0
    assert usage.file_kb > 0
    assert usage.anon_kb + usage.file_kb <= usage.rss_kb  # the rest is RssShmem
    # A large anonymous buffer, touched, shows in RssAnon and not in RssFile.
    buffer = bytearray(64 << 20)
    for i in range(0, len(buffer), 4096):
        buffer[i] = 1
    grown = read_usage(os.getpid())
    assert grown is not None
    assert grown.anon_kb - usage.anon_kb > 60 * 1024
    assert abs(grown.file_kb - usage.file_kb) < 8 * 1024
    del buffer


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


def _soak_result(rss_mb_at: object, minutes: int = 120) -> dict:
    """A recorded two-rank soak: a sample a minute, RSS from ``rss_mb_at(seconds)``."""
    samples = [
        {"t": 60.0 * m, "rank": rank, "threads": 120, "fds": 12,
         "rss_kb": int(rss_mb_at(60.0 * m) * 1024)}  # type: ignore[operator]
        for m in range(minutes + 1)
        for rank in (0, 1)
    ]  # fmt: skip
    return {"model": "mnist", "model_flags": [], "nodes": 2, "tasks_per_node": 1,
            "minutes": minutes, "steps": 9000, "warmup_s": 120.0, "samples": samples,
            "max_rss_slope_mb_h": 10.0}  # fmt: skip


def test_rejudge_cuts_a_long_soak_to_its_first_minutes_and_slopes_the_last_hour() -> None:
    # flat for 40 minutes, then +30 MB/h to the end
    result = _soak_result(lambda t: 900 + max(0.0, t - 2400) / 3600 * 30)
    first = rejudge(result, first_minutes=30)
    assert first["passed"], first["problems"]
    assert max(s["t"] for s in first["samples"]) == 1800
    assert first["minutes"] == 30
    assert "whole run" in str(first["steps"])
    whole = rejudge(result)
    assert not whole["passed"]
    assert "still rising at +30 MB/h" in whole["problems"][0]
    assert whole["last_hour_rss_slope_mb_h"]["0"] == pytest.approx(30, rel=1e-3)
    assert first["last_hour_rss_slope_mb_h"]["1"] == pytest.approx(0, abs=1e-9)
    with pytest.raises(ValueError, match="no samples"):
        rejudge(_soak_result(lambda t: 900, minutes=5), first_minutes=-1)
