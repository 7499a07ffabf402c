"""Sweeps: random search from a seed, and the results table of a job array."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

from slurmtf.cli import submit as submit_cli
from slurmtf.cli import sweep as sweep_cli
from slurmtf.errors import InputError
from slurmtf.monitor import records as jobrecord
from slurmtf.monitor import sweeps
from slurmtf.monitor.sweep_rows import point_row, render_csv, render_json, render_table, sort_rows
from slurmtf.spec import jobspec
from slurmtf.spec import values as jobvalues
from tests.helpers.fakeslurm import GONE, FakeSlurm

RANDOM = ["lr=log:1e-4:1e-1", "dropout=uniform:0:0.5", "batch_size=int:16:128", "opt=sgd,adam"]


def test_same_seed_same_points_other_seed_others() -> None:
    sweep = jobvalues.parse_sweep(RANDOM)
    first = jobvalues.sample_points(sweep, 16, seed=3)
    assert first == jobvalues.sample_points(sweep, 16, seed=3)
    assert first != jobvalues.sample_points(sweep, 16, seed=4)
    assert len(first) == 16
    for point in first:
        assert 1e-4 <= float(point["lr"]) <= 1e-1
        assert 0 <= float(point["dropout"]) <= 0.5
        assert 16 <= int(point["batch_size"]) <= 128
        assert point["opt"] in {"sgd", "adam"}
    # log-uniform: about as many points in each decade
    logs = [math.log10(float(p["lr"])) for p in jobvalues.sample_points(sweep, 300, seed=1)]
    assert all(60 <= sum(lo <= x < lo + 1 for x in logs) <= 140 for lo in (-4, -3, -2))


def test_a_random_sweep_renders_the_same_job_twice() -> None:
    def render() -> str:
        out = io.StringIO()
        argv = ["--dry_run", "--model=mnist", *(f"--sweep={s}" for s in RANDOM)]
        assert submit_cli.main([*argv, "--samples=4", "--seed=11"], out=out) == 0
        return out.getvalue()

    text = render()
    assert text == render()
    assert text.count("# array task") == 4
    assert "job array of 4 tasks" in text


def test_spec_keeps_samples_and_seed() -> None:
    spec = jobspec.JobSpec(
        kind="model", target="mnist", sweep=jobvalues.parse_sweep(RANDOM), samples=5, sweep_seed=2
    )
    again = jobspec.JobSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert again.grid == spec.grid
    assert len(spec.grid) == 5


@pytest.mark.parametrize(
    ("argv", "flag", "value"),
    [
        (["--sweep=lr=log:1e-4:1e-1"], "--sweep", "lr=log:1e-4:1e-1"),  # range, no samples
        (["--sweep=lr=log:0:1", "--samples=2"], "--sweep", "lr=log:0:1"),
        (["--sweep=lr=uniform:2:1", "--samples=2"], "--sweep", "uniform:2:1"),
        (["--sweep=lr=int:1.5:3", "--samples=2"], "--sweep", "int:1.5:3"),
        (["--sweep=lr=uniform:a:b", "--samples=2"], "--sweep", "uniform:a:b"),
        (["--samples=4"], "--samples", "4"),
        (["--sweep=lr=1,2", "--samples=-1"], "--samples", "-1"),
    ],
)
def test_bad_random_sweeps_are_one_line_with_a_hint(
    argv: list[str], flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert submit_cli.main(["--dry_run", "--model=mnist", *argv], out=io.StringIO()) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{flag}=" in err
    assert value in err
    assert "HINT: " in err


def _events(*events: dict[str, object]) -> list[dict[str, object]]:
    return list(events)


def launch(**params: str) -> dict[str, object]:
    return {"event": "launch", "rank": 0, "params": params}


def test_row_prefers_the_last_eval_and_marks_running_points() -> None:
    events = _events(
        launch(lr="0.1"),
        {"event": "progress", "step": 10, "total": 20, "loss": 0.9, "accuracy": 0.5,
         "examples_per_sec": 100.0},
        {"event": "eval", "step": 10, "loss": 0.7, "accuracy": 0.6},
    )  # fmt: skip
    running = point_row("5_0", "RUNNING", 0, events, logs="/l/5_0_0_log.out")
    assert (running.step, running.total, running.accuracy, running.loss) == (10, 20, 0.6, 0.7)
    assert running.params == {"lr": "0.1"}
    assert not running.final
    done = point_row(
        "5_0", "COMPLETED", None, [*events, launch(lr="0.1"), {"event": "done", "step": 20}],
        logs="x",
    )  # fmt: skip
    assert done.final
    assert done.step == 20
    assert done.restarts == 1
    text = render_table("5", [running, done])
    assert "partial" in text
    assert "0.6000*" in text
    assert "10/20*" in text


def rows() -> list[sweeps.SweepRow]:
    def one(task: int, lr: str, acc: float | None, state: str = "COMPLETED") -> sweeps.SweepRow:
        events = [launch(lr=lr)]
        if acc is not None:
            events.append({"event": "eval", "step": 20, "loss": 1 - acc, "accuracy": acc})
        error = "rank 0: ValueError: lr too big" if state.startswith("FAILED") else None
        return point_row(f"9_{task}", state, 0, events, logs=f"/l/9_{task}_0_log.out", error=error)

    return [one(0, "0.1", 0.5), one(1, "0.01", 0.9), one(2, "1.0", None, "FAILED"),
            one(3, "0.001", 0.7)]  # fmt: skip


def test_sort_by_metric_best_first_missing_last() -> None:
    assert [r.task for r in sort_rows(rows(), "accuracy")] == ["9_1", "9_3", "9_0", "9_2"]
    assert [r.task for r in sort_rows(rows(), "loss")] == ["9_1", "9_3", "9_0", "9_2"]
    assert [r.task for r in sort_rows(rows(), "lr")] == ["9_3", "9_1", "9_0", "9_2"]
    with pytest.raises(InputError, match=r"--sort.*HINT: one of accuracy"):
        sort_rows(rows(), "speed")


def test_table_csv_and_json() -> None:
    table = render_table("9", sort_rows(rows(), "accuracy"))
    lines = table.splitlines()
    assert lines[0] == "sweep 9: 4 points, 4 finished"
    assert lines[1].split()[:4] == ["task", "lr", "state", "restarts"]
    assert lines[2].split()[:2] == ["9_1", "0.01"]
    assert "0.9000" in lines[2]
    assert "    error: rank 0: ValueError: lr too big" in lines
    parsed = list(csv.DictReader(io.StringIO(render_csv(rows()))))
    assert [p["accuracy"] for p in parsed] == ["0.5", "0.9", "", "0.7"]
    assert parsed[2]["error"] == "rank 0: ValueError: lr too big"
    assert parsed[2]["lr"] == "1.0"
    points = json.loads(render_json("9", rows()))["points"]
    assert points[1]["params"] == {"lr": "0.01"}
    assert points[1]["accuracy"] == 0.9


@pytest.mark.parametrize(
    ("spec", "tasks"),
    [("3", [3]), ("2-5", [2, 3, 4, 5]), ("1,4-6%2", [1, 4, 5, 6]), ("0-6:2", [0, 2, 4, 6]),
     ("", []), ("[0-1]", [0, 1])],
)  # fmt: skip
def test_array_task_ids(spec: str, tasks: list[int]) -> None:
    assert sweeps.task_ids(spec) == tasks


def test_sweep_from_slurm_and_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Task 0 is recorded and done (Slurm knows it as COMPLETED), 1 failed, 2-3 pending."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    for task, acc in ((0, 0.8), (1, None)):
        jobrecord.append(f"9_{task}", logs, "{job}_{rank}_log.{kind}")
        lines = [launch(lr=str(task))]
        if acc is not None:
            lines += [{"event": "eval", "step": 4, "loss": 0.2, "accuracy": acc},
                      {"event": "done", "step": 4}]  # fmt: skip
        (logs / f"9_{task}_0_log.out").write_text("".join(json.dumps(e) + "\n" for e in lines))
        (logs / f"9_{task}_0_log.err").write_text("" if acc else "ValueError: bad lr\n")
    scontrol = (
        "JobId=10 ArrayJobId=9 ArrayTaskId=0 JobState=COMPLETED Restarts=0\n"
        "JobId=11 ArrayJobId=9 ArrayTaskId=1 JobState=FAILED Restarts=1\n"
        "JobId=9 ArrayJobId=9 ArrayTaskId=2-3%2 JobState=PENDING Restarts=0\n"
    )
    fake = FakeSlurm({"scontrol": [(0, scontrol, "")]})
    assert sweep_cli.main(["9", "--csv", "--sort=accuracy"], runner=fake) == 0
    parsed = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(p["task"], p["state"], p["accuracy"]) for p in parsed] == [
        ("9_0", "COMPLETED", "0.8"), ("9_1", "FAILED", ""), ("9_2", "PENDING", ""),
        ("9_3", "PENDING", ""),
    ]  # fmt: skip
    assert parsed[1]["error"] == "rank 0: ValueError: bad lr"
    assert parsed[1]["restarts"] == "1"
    # Slurm forgot the job: the record and the logs still give the table
    gone = FakeSlurm({"scontrol": [GONE]})
    from slurmtf.cli import jobs as jobs_cli

    assert jobs_cli.main(["status", "9"], runner=gone) == 0
    out = capsys.readouterr().out
    assert out.startswith("sweep 9: 2 points, 1 finished (partial")
    assert "0.8000" in out
    assert "error: rank 0: ValueError: bad lr" in out


def test_not_an_array_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    fake = FakeSlurm({"scontrol": [(0, "JobId=7 JobState=RUNNING\n", "")]})
    assert sweep_cli.main(["7"], runner=fake) == 2
    err = capsys.readouterr().err
    assert "JOB='7'" in err
    assert "HINT: " in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("Traceback:\n  x\nAssertionError: diverged\nsrun: error: node1: task 0: Exited\n",
         "AssertionError: diverged"),
        ("models.mnist: --lr=-1: is negative. HINT: positive\n",
         "models.mnist: --lr=-1: is negative. HINT: positive"),
        ("W0000 noise\nsrun: error: node1: task 0: Killed\n", "srun: error: node1: task 0: Killed"),
        ("I0000 all fine\n", None),
    ],
)  # fmt: skip
def test_error_line_prefers_the_points_own_words(text: str, line: str | None) -> None:
    from slurmtf.monitor.sweep_rows import error_line

    assert error_line(text) == line
