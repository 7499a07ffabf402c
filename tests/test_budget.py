"""slurmtf.runtime.recovery.budget: what MAX_RESTARTS counts (RESTART_BUDGET), the rate
limit (MAX_FAILURES_PER_HOUR), the settings and flags that carry them. Values in,
values out; the edge on log files the tests write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slurmtf.errors import InputError
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.runtime.recovery.after_step import Step, decide_and_record
from slurmtf.runtime.recovery.budget import Budget, Policy, count_budget, parse_mode
from slurmtf.runtime.recovery.decision import after_batch_host, after_supervisor, decide
from slurmtf.runtime.recovery.endings import Attempt, TaskEnding
from slurmtf.runtime.recovery.evidence import LogFiles, reached_in_logs
from slurmtf.runtime.recovery.record import read_record
from slurmtf.spec.jobspec import JobSpec, supervisor_setup

KILLED = TaskEnding.parse("task 1: Killed")
NOW = 100_000.0


def failure(reached: int | None, *, at: float = 0.0, action: str = "restart") -> dict[str, Any]:
    """One failure of the job's record, as after_step writes it."""
    return {"time": at, "action": action, "reached": reached, "progress": False}


def history(*steps: int | None, at: float = 0.0) -> list[dict[str, Any]]:
    """The record of failures whose attempts reached ``steps``, ``progress`` as recorded."""
    records: list[dict[str, Any]] = []
    for step in steps:
        best = max((r["reached"] for r in records if r["reached"] is not None), default=0)
        records.append({**failure(step, at=at), "progress": step is not None and step > best})
    return records


def killed(step: int | None) -> Attempt:
    """An attempt whose rank 1 was killed after rank 0 reported ``step``."""
    events = {0: [{"event": "progress", "step": step, "total": 1000}]} if step is not None else {}
    assert KILLED is not None
    return Attempt(137, (KILLED,), events)


# (name, records' steps, this attempt's step, policy, (expected used, progressed, spent))
CASES = [
    ("first failure, no step", (), None, Policy(3), (0, False, False)),
    ("first failure after steps", (), 40, Policy(3), (0, True, False)),
    ("3 without progress", (None, None, None), None, Policy(3), (3, False, True)),
    ("same step again and again", (50, 50, 50), 50, Policy(3), (2, False, False)),
    ("and once more", (50, 50, 50, 50), 50, Policy(3), (3, False, True)),
    ("progress resets", (10, 10, 10), 20, Policy(3), (2, True, False)),
    ("progress long ago", (10, 20, 30, 30, 30, 30), 30, Policy(3), (3, False, True)),
    ("many failures, each further", (10, 20, 30, 40, 50, 60, 70), 80, Policy(3), (0, True, False)),
    ("total counts every restart", (10, 20, 30), 40, Policy(3, "total"), (3, True, True)),
    ("total within its limit", (10, 20), 30, Policy(3, "total"), (2, True, False)),
    ("no restarts at all", (), 40, Policy(0), (0, True, True)),
    ("lower step than before", (100,), 60, Policy(3), (0, False, False)),
]


@pytest.mark.parametrize(
    ("steps", "reached", "policy", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_the_budget_counts_failures_without_progress(
    steps: tuple[int | None, ...],
    reached: int | None,
    policy: Policy,
    expected: tuple[int, bool, bool],
) -> None:
    budget = count_budget(history(*steps), 0, policy, reached, NOW)
    assert (budget.used, budget.progressed, budget.spent) == expected
    assert budget.so_far == len(steps)  # every restart so far: the attempt number


def test_slurms_own_requeues_count_as_failures_without_progress() -> None:
    records = history(10, 20)  # the second made progress: the count starts again
    assert count_budget(records, 0, Policy(3)).used == 0
    budget = count_budget(records, 3, Policy(3))  # 3 requeues, none of them recorded
    assert (budget.used, budget.so_far, budget.spent) == (3, 5, True)
    assert count_budget(records, 3, Policy(3, "total")).used == 5


def test_the_rate_limit_counts_the_failures_of_the_last_hour() -> None:
    recent = [failure(10 * i, at=NOW - 60 * i) for i in range(1, 6)]  # 5 in 5 minutes
    old = [failure(1, at=NOW - 7200) for _ in range(20)]
    fine = count_budget(old + recent, 0, Policy(3, per_hour=6), 1000, NOW)
    assert (fine.last_hour, fine.progressed, fine.spent) == (5, True, False)
    more = [*old, *recent, failure(60, at=NOW - 1)]
    over = count_budget(more, 0, Policy(3, per_hour=6), 1000, NOW)
    assert (over.last_hour, over.spent) == (6, True)
    assert "7 failures within an hour (MAX_FAILURES_PER_HOUR=6)" in over.why_spent()
    off = count_budget(more, 0, Policy(3), 1000, NOW)
    assert not off.spent  # 0: no limit


def test_a_job_that_advances_goes_past_max_restarts_and_one_that_does_not_stops() -> None:
    records: list[dict[str, Any]] = []
    for step in (100, 200, 300, 400, 500, 600):  # six failures, each further
        budget = count_budget(records, 0, Policy(3), step, NOW)
        decision = decide(killed(step), budget)
        assert decision.action == "restart", decision
        line = decision.line("7", 11)
        assert line.startswith(f"restart {len(records) + 1} in place (0 of 3 without progress: ")
        reached = f"training reached step {step}, MAX_RESTARTS), 11.0 s after rank 1 was killed"
        assert reached in line
        records.append({**failure(step), "progress": budget.progressed})
    lines = []
    for _ in range(4):  # then stuck at step 600
        budget = count_budget(records, 0, Policy(3), 600, NOW)
        decision = decide(killed(600), budget)
        lines.append(decision.line("7"))
        records.append({**failure(600), "progress": budget.progressed})
    assert lines[0].startswith("restart 7 in place (1 of 3 without progress, MAX_RESTARTS)")
    assert lines[2].startswith("restart 9 in place (3 of 3 without progress, MAX_RESTARTS)")
    assert decision.action == "stop"
    assert lines[3] == (
        "failed: rank 1 was killed by SIGKILL; not restarted: already restarted 3 time(s) in "
        "a row without progress (MAX_RESTARTS=3)"
    )


def test_total_keeps_the_old_count_and_words() -> None:
    budget = count_budget(history(100, 200), 0, Policy(3, "total"), 300, NOW)
    decision = decide(killed(300), budget)
    assert decision.line("7", 4).startswith(
        "restart 3 of 3 in place (MAX_RESTARTS), 4.0 s after rank 1 was killed by SIGKILL;"
    )
    spent = count_budget(history(100, 200, 300), 0, Policy(3, "total"), 400, NOW)
    assert decide(killed(400), spent).why.endswith(
        "not restarted: already restarted 3 time(s) (MAX_RESTARTS=3)"
    )
    assert Budget(1, 3, "total").counted() == ""


def test_batch_side_decisions_spend_the_same_budget() -> None:
    stuck = count_budget(history(5, 5, 5, 5), 0, Policy(3), 5, NOW)
    assert after_supervisor("the supervisor was killed", stuck).action == "stop"
    moved = count_budget(history(5, 5, 5, 5), 0, Policy(3), 9, NOW)
    lost = after_batch_host("batch host node1 lost", "node1", moved)
    assert (lost.action, lost.restart) == ("requeue", 5)
    assert lost.line("7").endswith(
        "(restart 5, 0 of 3 without progress: training reached step 9, MAX_RESTARTS)"
    )


@pytest.mark.parametrize(
    ("environ", "problem"),
    [
        ({"RESTART_BUDGET": "tota"}, "RESTART_BUDGET='tota': is not a restart budget. HINT: "),
        ({"MAX_FAILURES_PER_HOUR": "six"}, "MAX_FAILURES_PER_HOUR='six': is not a whole number"),
        ({"MAX_FAILURES_PER_HOUR": "-1"}, "MAX_FAILURES_PER_HOUR='-1': is not a whole number"),
    ],
)
def test_bad_settings_name_the_variable_the_value_and_a_hint(
    environ: dict[str, str], problem: str
) -> None:
    with pytest.raises(InputError) as caught:
        JobSettings.read("mnist", environ)
    assert problem in str(caught.value)
    assert "HINT" in str(caught.value)


def test_the_settings_reader_reads_the_budget() -> None:
    assert JobSettings.read("mnist", {}).policy == Policy(3, "progress", 0)
    environ = {"MAX_RESTARTS": "5", "RESTART_BUDGET": "Total", "MAX_FAILURES_PER_HOUR": "6"}
    assert JobSettings.read("mnist", environ).policy == Policy(5, "total", 6)
    assert JobSettings.read("mnist", {"MAX_REQUEUES": "2"}).policy.limit == 2
    assert parse_mode(" progress ") == "progress"
    with pytest.raises(InputError, match="--restart_budget='all': is not a restart budget"):
        parse_mode("all", "--restart_budget")
    with pytest.raises(InputError, match="RESTART_BUDGET='x': is not a budget"):
        Policy(3, "x")


def test_submit_renders_the_budget_flags_for_the_supervisor() -> None:
    base = JobSpec(kind="module", target="mypkg.train")
    (plain,) = [x for x in supervisor_setup(base, "python3") if x.startswith("srun()")]
    assert "--max_restarts=3 --" in plain
    assert "--restart_budget" not in plain
    spec = JobSpec(kind="module", target="mypkg.train", restart_budget="total",
                   max_failures_per_hour=6)  # fmt: skip
    (line,) = [x for x in supervisor_setup(spec, "python3") if x.startswith("srun()")]
    assert "--max_restarts=3 --restart_budget=total --max_failures_per_hour=6 --" in line
    with pytest.raises(InputError, match="--restart_budget='some'"):
        JobSpec(kind="module", target="mypkg.train", restart_budget="some")
    with pytest.raises(InputError, match="--max_failures_per_hour"):
        JobSpec(kind="module", target="mypkg.train", max_failures_per_hour=-1)


def write_rank(log_dir: Path, rank: int, *events: dict[str, Any], noise: int = 0) -> None:
    lines = ["x" * 100] * noise + [json.dumps(e) for e in events]
    (log_dir / f"rank{rank}.out").write_text("\n".join(lines) + "\n")


def test_the_logs_say_how_far_training_got(tmp_path: Path) -> None:
    write_rank(tmp_path, 0, {"event": "progress", "step": 70}, {"event": "progress", "step": 90})
    write_rank(tmp_path, 1, {"event": "done", "step": 95}, {"event": "cluster", "step": 999})
    assert reached_in_logs(LogFiles(tmp_path)) == 95
    write_rank(tmp_path, 1, {"event": "progress", "step": 500}, noise=5000)  # 500 kB before it
    assert reached_in_logs(LogFiles(tmp_path), tail=1024) == 500
    far = json.dumps({"event": "progress", "step": 700}) + "\n" + "y" * 4096
    (tmp_path / "rank1.out").write_text(far)
    assert reached_in_logs(LogFiles(tmp_path), tail=1024) == 90  # rank 1's event is too far back
    assert reached_in_logs(LogFiles(tmp_path / "none")) is None


def test_the_supervisors_decisions_record_progress_and_reset_the_count(tmp_path: Path) -> None:
    """The edge: a job killed four times, each attempt further, restarts every time;
    then stuck at step 40 it stops at the fourth failure without progress. The record
    keeps each attempt's step."""
    srun = tmp_path / "srun.err"
    lines = []
    for attempt, step in enumerate((10, 20, 30, 40, 40, 40, 40, 40)):
        offsets = {str(p): p.stat().st_size for p in tmp_path.glob("*") if p.is_file()}
        with (tmp_path / "rank0.out").open("a") as out:
            out.write(json.dumps({"event": "progress", "step": step}) + "\n")
        with srun.open("a") as err:
            err.write("srun: error: node2: task 1: Killed\n")
        files = LogFiles(tmp_path, srun_err=srun, offsets=offsets)
        decision, line = decide_and_record(Step("7", 137, 3, on_this_machine=True), files)
        lines.append(line)
        assert decision.action == ("stop" if attempt == 7 else "restart"), line
    records = read_record(tmp_path, "7")
    assert [r["reached"] for r in records] == [10, 20, 30, 40, 40, 40, 40, 40]
    assert [r["progress"] for r in records] == [True] * 4 + [False] * 4
    assert "restart 4 in place (0 of 3 without progress: training reached step 40" in lines[3]
    assert lines[5].startswith("restart 6 in place (2 of 3 without progress, MAX_RESTARTS)")
    assert "already restarted 3 time(s) in a row without progress" in lines[7]
