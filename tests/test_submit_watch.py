"""status/logs/cancel and the --wait follower against a fake Slurm runner."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from slurmtf.cli import jobs as jobs_cli
from slurmtf.monitor import status as watch
from slurmtf.runtime.rank import launcher as launch
from tests.helpers.fakeslurm import GONE, NO_ACCT, FakeSlurm, scontrol


@pytest.mark.parametrize(
    ("state", "code", "status"),
    [
        ("COMPLETED", "0:0", 0),
        ("FAILED", "3:0", 3),
        ("FAILED", "0:9", 137),
        ("CANCELLED", "0:15", 143),
        ("CANCELLED", "0:0", 130),
        ("TIMEOUT", "0:0", 124),
        ("CANCELLED+", "0:0", 130),
    ],
)
def test_exit_status(state: str, code: str, status: int) -> None:
    assert watch.exit_status(state, code) == status


def test_status_running(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeSlurm({"scontrol": [scontrol("RUNNING")]})
    assert jobs_cli.main(["status", "7"], runner=fake) == 0
    assert "job 7: RUNNING (exit 0:0) [scontrol]" in capsys.readouterr().out


def test_status_falls_back_to_sacct_then_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeSlurm({"scontrol": [GONE], "sacct": [(0, "7|COMPLETED|0:0\n", "")]})
    assert jobs_cli.main(["status", "7", f"--log_dir={tmp_path}"], runner=fake) == 0
    assert "COMPLETED (exit 0:0) [sacct]" in capsys.readouterr().out
    (tmp_path / "7_0_log.out").write_text('noise\n{"event": "exit", "rank": 0, "status": 3}\n')
    fake = FakeSlurm({"scontrol": [GONE], "sacct": [NO_ACCT]})
    assert jobs_cli.main(["status", "7", f"--log_dir={tmp_path}"], runner=fake) == 0
    out = capsys.readouterr().out
    assert "accounting is unavailable" in out
    assert "from its rank 0 log: 3" in out
    assert "HINT" in out


def test_cancel_runs_scancel_and_shows_its_error(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeSlurm({"scancel": [(0, "", "")]})
    assert jobs_cli.main(["cancel", "7_2"], runner=fake) == 0
    assert fake.calls == [["scancel", "7_2"]]
    fake = FakeSlurm({"scancel": [(1, "", "scancel: error: Invalid job id 99")]})
    assert jobs_cli.main(["cancel", "99"], runner=fake) == 1
    assert "Invalid job id 99" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv", [["status"], ["status", "abc"], ["logs", "7", "--bogus=1"], ["frobnicate", "7"]]
)
def test_usage_errors(argv: list[str]) -> None:
    assert jobs_cli.main(argv, runner=FakeSlurm({})) == 2


def test_logs_prints_a_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "7_1_log.out").write_text("rank one says hi\n")
    assert (
        jobs_cli.main(["logs", "7", "--rank=1", f"--log_dir={tmp_path}"], runner=FakeSlurm({})) == 0
    )
    assert capsys.readouterr().out == "rank one says hi\n"
    assert (
        jobs_cli.main(["logs", "7", "--rank=5", f"--log_dir={tmp_path}"], runner=FakeSlurm({})) == 2
    )


def test_follow_prints_rank0_until_the_end_and_summarizes(tmp_path: Path) -> None:
    log = tmp_path / "7_0_log.out"
    lines = [
        json.dumps({"event": "eval", "step": 10, "accuracy": 0.5}),
        json.dumps({"event": "eval", "step": 20, "accuracy": 0.875}),
    ]
    fake = FakeSlurm(
        {"scontrol": [scontrol("PENDING"), scontrol("RUNNING"), scontrol("COMPLETED")]}
    )

    def sleep(_: float) -> None:  # the job writes its log between polls
        with log.open("a") as handle:
            handle.write(lines.pop(0) + "\n" if lines else "")

    out = io.StringIO()
    status = watch.follow("7", tmp_path, 2, runner=fake, out=out, poll_s=0, sleep=sleep)
    text = out.getvalue()
    assert status == 0
    assert "eval at step 10: loss ?, accuracy 0.5000" in text
    assert '"event"' not in text  # events as human lines, never raw JSON
    assert "final accuracy 0.8750 (step 20)" in text
    assert f"rank 1: {tmp_path}/7_1_log.out" in text
    assert "PENDING" in text
    assert "COMPLETED" in text


def test_summary_labels_an_accuracy_on_synthetic_data(tmp_path: Path) -> None:
    lines = [{"event": "eval", "step": 60, "accuracy": 1.0}]
    (tmp_path / "8_0_log.out").write_text(
        "\n".join(json.dumps(e) for e in [{"event": "cluster", "synthetic": True}, *lines])
    )
    (tmp_path / "9_0_log.out").write_text(
        "\n".join(json.dumps(e) for e in [{"event": "cluster", "synthetic": False}, *lines])
    )
    synthetic = watch.summary("8", tmp_path, 1, 0)
    assert "final accuracy 1.0000 (step 60) on SYNTHETIC data" in synthetic
    assert "SYNTHETIC" not in watch.summary("9", tmp_path, 1, 0)


def test_follow_exits_with_the_job_status(tmp_path: Path) -> None:
    fake = FakeSlurm({"scontrol": [scontrol("FAILED", "75:0")]})
    out = io.StringIO()
    assert watch.follow("7", tmp_path, 1, runner=fake, out=out, sleep=lambda _: None) == 75


def test_job_id_of_array_task() -> None:
    env = {"SLURM_JOB_ID": "12", "SLURM_ARRAY_JOB_ID": "10", "SLURM_ARRAY_TASK_ID": "2"}
    assert launch.job_id_of(env) == "10_2"
    assert launch.job_id_of({"SLURM_JOB_ID": "12"}) == "12"
    assert launch.job_id_of({"SLURM_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "2"}) == "12"
    assert launch.job_id_of({}) == "local"
