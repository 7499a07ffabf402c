"""Pure parts of the soak with failures (benchmarks.soak_failures): a rank's lives and the
verdict over them (no Slurm, no TF)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.soak_failures import count_event_files, count_files, judge, lives

Result = dict[str, Any]


def _result(rank_rss: float = 0.0, supervisor_fds: float = 0.0, files: float = 0.0) -> Result:
    """A 20-minute run: a supervisor sampled every 10 s, a rank and a warm rank replaced
    every 60 s; each new rank life adds ``rank_rss`` kB, every minute adds
    ``supervisor_fds`` fds to the supervisor and ``files`` files to the run folder."""
    samples: list[Result] = []
    counts: list[Result] = []
    for t in range(0, 1200, 10):
        fds = 12 + int(supervisor_fds * t / 60)
        samples.append({"t": t, "kind": "batch", "pid": 10, "threads": 3, "rss_kb": 40_000,
                        "fds": fds})  # fmt: skip
        life = t // 60
        rss = 700_000 + rank_rss * life + (t % 60) * 100  # grows within a life, then peaks
        samples.append({"t": t, "kind": "rank0", "pid": 1000 + life, "threads": 40,
                        "rss_kb": rss, "fds": 30})  # fmt: skip
        samples.append({"t": t, "kind": "warm0", "pid": 2000 + life, "threads": 20,
                        "rss_kb": 650_000, "fds": 9})  # fmt: skip
        counts.append({"t": t, "processes": 9, "warm": 1, "files": 40 + files * (t // 60),
                       "tmp": 5})  # fmt: skip
    return {"warmup": 120.0, "state": "RUNNING", "kills_s": list(range(60, 1200, 60)),
            "samples": samples, "counts": counts,
            "status": {"failures": 19, "steps_redone": 0}}  # fmt: skip


def test_each_process_is_one_life_with_its_peak_and_warm_and_rank_lives_apart() -> None:
    roles = lives(_result()["samples"])
    assert sorted(roles) == ["rank0", "warm0"]  # the supervisor lasts: not a life
    assert len(roles["rank0"]) == 20
    first = roles["rank0"][0]
    assert (first["t"], first["samples"]) == (0, 6)
    assert first["rss_kb"] == 700_000 + 50 * 100  # its peak, at its last sample
    # a warm rank that takes over keeps its pid: one warm life, then one rank life
    taken = [
        {"t": 0, "kind": "warm1", "pid": 7, "threads": 20, "rss_kb": 1, "fds": 9},
        {"t": 2, "kind": "rank1", "pid": 7, "threads": 45, "rss_kb": 2, "fds": 31},
    ]
    both = lives(taken)
    assert (both["warm1"][0]["threads"], both["rank1"][0]["threads"]) == (20, 45)


def test_a_flat_run_with_failures_passes() -> None:
    judged = judge(_result())
    assert judged["problems"] == []
    assert judged["trends"]["rank0"]["rss_kb"]["growth"] == 0


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"rank_rss": 20_000}, "rank0: RSS grew by"),  # +20 MB a life: +50 % in 20 lives
        ({"supervisor_fds": 1}, "batch: open fds grew by"),
        ({"files": 1}, "files: grew from"),
    ],
)
def test_growth_across_lives_or_in_the_supervisor_fails(change: Result, problem: str) -> None:
    assert any(p.startswith(problem) for p in judge(_result(**change))["problems"])


def test_a_job_that_ended_a_second_supervisor_or_steps_redone_fail() -> None:
    ended = {**_result(), "state": "FAILED"}
    assert "job ended FAILED" in judge(ended)["problems"]
    second = _result()
    second["samples"].append({"t": 600, "kind": "batch", "pid": 11, "threads": 3,
                              "rss_kb": 40_000, "fds": 12})  # fmt: skip
    assert "batch: 2 processes, not one" in judge(second)["problems"]
    redone = {**_result(), "status": {"failures": 19, "steps_redone": 25}}
    assert "25 steps redone in 19 failures" in judge(redone)["problems"]
    missed = {**_result(), "status": {"failures": 3, "steps_redone": 0}}
    assert "3 failures on record for 19 kills" in judge(missed)["problems"]


def test_count_files_walks_every_root_skips_a_missing_one_and_tensorboards_files(
    tmp_path: Path,
) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c").write_text("x")
    assert count_files(tmp_path / "a", tmp_path / "missing") == 2
    # TensorBoard's event files are the run's record, counted apart
    (tmp_path / "a" / "events.out.tfevents.1796254342.vm.11006.2.v2").write_text("")
    assert count_files(tmp_path / "a") == 2
    assert count_event_files(tmp_path / "a") == 1
