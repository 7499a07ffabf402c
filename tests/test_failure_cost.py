"""What a job's failures cost (slurmtf.monitor.failure_cost), from made-up event lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slurmtf.monitor.failure_cost import Cost, attempts, job_cost
from slurmtf.monitor.records import JobPlace
from slurmtf.monitor.status import status_lines
from slurmtf.runtime.recovery.record import record_path, write_record
from tests.helpers.fakeslurm import FakeSlurm, scontrol


def start(t: float) -> dict[str, Any]:
    return {"event": "cluster", "rank": 0, "time": t}


def step(t: float, n: int, name: str = "progress") -> dict[str, Any]:
    return {"event": name, "step": n, "time": t}


def steady(t0: float, steps: range, pace: float) -> list[dict[str, Any]]:
    return [step(t0 + (n - steps[0]) * pace, n) for n in steps]


def test_an_undisturbed_job_has_no_failures_and_full_goodput():
    cost = job_cost([start(0), *steady(10, range(10, 101, 10), 1.0)], [])
    assert cost == Cost(0, goodput=1.0)


def test_a_job_without_step_events_says_nothing_of_seconds():
    cost = job_cost([start(0), start(50)], [{"action": "restart"}])
    assert cost == Cost(1, 0, None, None)
    assert cost.words() == "1 failure: 0 steps redone"


def test_a_resume_from_memory_costs_the_gap_less_the_steps_between():
    # 1 s a step; last event at step 50 (t=50); killed; rescued at 53; back at 60 at t=75:
    # steps 50..60 take 10 s, so 15 s were lost and nothing redone.
    first = [start(0), *steady(10, range(10, 51, 10), 1.0), step(53.2, 53, "rescued")]
    second = [start(62), {"event": "resumed", "step": 53, "time": 70}]
    second += steady(75, range(60, 101, 10), 1.0)
    cost = job_cost([*first, *second], [{"action": "restart", "time": 55}])
    assert cost.failures == 1
    assert cost.steps_redone == 0
    assert cost.seconds_lost == pytest.approx(15.0)
    assert cost.goodput == pytest.approx(1 - 15 / (115 - 10))
    assert cost.words() == "1 failure: 15.0 s lost, 0 steps redone, goodput 0.86"


def test_steps_redone_count_from_the_highest_step_to_the_resumed_one():
    first = [start(0), *steady(10, range(10, 41, 10), 2.0)]  # reached 40
    second = [start(100), {"event": "resumed", "step": 20}, *steady(110, range(30, 61, 10), 2.0)]
    cost = job_cost([*first, *second], [{"action": "requeue"}])
    assert cost.steps_redone == 20
    # 40 at t=70, 30 at t=110: no step gained, 40 s lost (the redone steps are lost time).
    assert cost.seconds_lost == pytest.approx(40.0)


def test_a_start_without_a_resumed_event_began_at_step_zero():
    first = [start(0), *steady(10, range(10, 31, 10), 1.0)]
    second = [start(40), *steady(50, range(10, 31, 10), 1.0)]
    assert job_cost([*first, *second], [{"action": "restart"}]).steps_redone == 30


def test_failures_count_the_records_or_the_starts_whichever_is_more():
    runs = [start(0), step(1, 1), start(5), step(6, 2), start(9), step(10, 3)]
    assert job_cost(runs, [{"action": "restart"}]).failures == 2
    records = [{"action": "restart"}, {"action": "requeue"}, {"action": "stop"}]
    assert job_cost(runs[:2], records).failures == 2


def test_the_pace_leaves_out_each_attempts_first_interval():
    # The first interval (compilation) takes 30 s; the steady pace is 1 s a step.
    first = [start(0), step(10, 10), step(50, 20), step(60, 30), step(70, 40)]
    second = [start(80), {"event": "resumed", "step": 40}, step(100, 50), step(110, 60)]
    cost = job_cost([*first, *second], [{"action": "restart"}])
    assert cost.seconds_lost == pytest.approx(100 - 70 - 10)


def test_events_without_times_give_steps_only():
    first = [{"event": "cluster"}, {"event": "progress", "step": 10}]
    second = [{"event": "cluster"}, {"event": "resumed", "step": 8}]
    second.append({"event": "progress", "step": 20})
    cost = job_cost([*first, *second], [{"action": "restart"}])
    assert (cost.steps_redone, cost.seconds_lost, cost.goodput) == (2, None, None)


def test_attempts_drop_what_came_before_the_first_start():
    cut = attempts([step(0, 1), start(1), step(2, 2), start(3)])
    assert [[e.get("step") for e in run] for run in cut] == [[None, 2], [None]]


def test_status_sums_the_cost_of_a_restarted_job(tmp_path: Path) -> None:
    first = [start(0), *steady(10, range(10, 51, 10), 1.0), step(53.2, 53, "rescued")]
    second = [start(62), {"event": "resumed", "step": 53, "time": 70}]
    second += steady(75, range(60, 101, 10), 1.0)
    (tmp_path / "rank0.out").write_text("".join(json.dumps(e) + "\n" for e in first + second))
    write_record(record_path(tmp_path, "7"), {"action": "restart", "time": 55, "line": "x"})
    place = JobPlace("7", tmp_path, "rank{rank}.{kind}", "given")
    text = status_lines("7", FakeSlurm({"scontrol": [scontrol("RUNNING")]}), place)
    assert "  1 failure: 15.0 s lost, 0 steps redone, goodput 0.86 (rank 0's events)" in text
    (tmp_path / "rank0.out").write_text("".join(json.dumps(e) + "\n" for e in first))
    record_path(tmp_path, "7").unlink()
    text = status_lines("7", FakeSlurm({"scontrol": [scontrol("RUNNING")]}), place)
    assert not any("failure" in line for line in text), text
