"""``slurmtf plot``: the series read from event lines, the PNG, the missing extra."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from slurmtf.cli import plot as plot_cli
from slurmtf.contracts import SUBMITIT_LOG_NAME
from slurmtf.monitor import plot
from slurmtf.monitor.records import JobPlace

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_rank(folder: Path, job: str, rank: int, events: list[dict[str, object]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    name = SUBMITIT_LOG_NAME.format(job=job, rank=rank, kind="out")
    (folder / name).write_text("plain text line\n" + "\n".join(json.dumps(e) for e in events))
    (folder / name.replace(".out", ".err")).write_text("")


def progress(step: int, loss: float, rate: float = 100.0) -> dict[str, object]:
    return {"event": "progress", "step": step, "total": 40, "loss": loss, "accuracy": 1 - loss,
            "examples_per_sec": rate}  # fmt: skip


def chief_events(params: dict[str, str] | None = None) -> list[dict[str, object]]:
    """Two starts: preempted at step 20, resumed, finished at 40."""
    launch = [{"event": "launch", "rank": 0, "params": params}] if params else []
    return [
        *launch,
        {"event": "cluster", "rank": 0, "global_batch": 64},
        progress(10, 0.9), progress(20, 0.5),
        {"event": "done", "rank": 0, "step": 20, "preempted": True},
        {"event": "cluster", "rank": 0, "global_batch": 64, "restart_count": 1},
        progress(30, 0.3), {"event": "eval", "step": 40, "loss": 0.2, "accuracy": 0.9},
        progress(40, 0.1),
    ]  # fmt: skip


def test_series_of_a_job_with_a_preemption_and_a_restart(tmp_path: Path) -> None:
    write_rank(tmp_path, "7", 0, chief_events())
    write_rank(tmp_path, "7", 1, [progress(10, 0.9, rate=50.0)])  # a rank reporting its own
    place = JobPlace("7", tmp_path, SUBMITIT_LOG_NAME, "given")
    (run, label), *_ = plot.runs_of(place)
    series = plot.series_of(run, label)
    assert series.train_loss == [(10, 0.9), (20, 0.5), (30, 0.3), (40, 0.1)]
    assert series.eval_loss == [(40, 0.2)]
    assert series.eval_accuracy == [(40, 0.9)]
    assert series.rate == {0: [(10, 100), (20, 100), (30, 100), (40, 100)], 1: [(10, 50)]}
    assert series.preemptions == [20]
    assert series.restarts == [20]


def test_plot_writes_a_png_for_a_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_rank(tmp_path / "logs", "7", 0, chief_events())
    out = tmp_path / "job.png"
    assert plot_cli.main(["7", f"--log_dir={tmp_path / 'logs'}", f"--out={out}"]) == 0
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert f"wrote {out} (job 7)" in capsys.readouterr().out


def test_a_running_job_is_drawn_as_far_as_it_has_logged(tmp_path: Path) -> None:
    """No ``done`` yet, the last line half-written: the steps so far, and a PNG."""
    logs = tmp_path / "logs"
    write_rank(
        logs, "8", 0, [{"event": "cluster", "rank": 0}, progress(10, 0.9), progress(20, 0.7)]
    )
    chief = logs / SUBMITIT_LOG_NAME.format(job="8", rank=0, kind="out")
    with chief.open("a") as sink:
        sink.write('\n{"event": "progress", "step": 3')  # the rank is writing it right now
    (run, label), *_ = plot.runs_of(JobPlace("8", logs, SUBMITIT_LOG_NAME, "given"))
    assert plot.series_of(run, label).train_loss == [(10, 0.9), (20, 0.7)]
    out = tmp_path / "running.png"
    assert plot_cli.main(["8", f"--log_dir={logs}", f"--out={out}"]) == 0
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_a_sweep_is_one_curve_per_point_labelled_by_its_parameters(tmp_path: Path) -> None:
    for index, lr in enumerate(("0.1", "0.01")):
        write_rank(tmp_path, f"9_{index}", 0, chief_events({"lr": lr, "seed": "1"}))
    place = JobPlace("9", tmp_path, SUBMITIT_LOG_NAME, "given")
    runs = plot.runs_of(place)
    assert [label for _, label in runs] == ["lr=0.1 seed=1", "lr=0.01 seed=1"]
    out = tmp_path / "sweep.png"
    assert plot_cli.main(["9", f"--log_dir={tmp_path}", f"--out={out}"]) == 0
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_no_logs_and_a_bad_job_id_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert plot_cli.main(["5", f"--log_dir={tmp_path}"]) == 2
    assert "JOB='5': has no logs in" in capsys.readouterr().err
    assert plot_cli.main(["x1", f"--log_dir={tmp_path}"]) == 2


def test_without_matplotlib_the_error_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_rank(tmp_path, "7", 0, chief_events())
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    assert plot_cli.main(["7", f"--log_dir={tmp_path}", f"--out={tmp_path / 'x.png'}"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == ("slurmtf plot: matplotlib is not installed. HINT: pip install 'slurmtf[plot]'")
    assert not (tmp_path / "x.png").exists()
