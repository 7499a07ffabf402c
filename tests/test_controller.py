"""A controller that does not answer: the classifier of Slurm's words (each wording as the
commands print it, 22.05 to 26.05), the brief retry, and `slurmtf status|logs|cancel`
answering from the job's record and logs. A fake Slurm, no daemons."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from slurmtf.cli import jobs as jobs_cli
from slurmtf.contracts import SCRIPT_LOG_NAME
from slurmtf.errors import SlurmCommandError
from slurmtf.monitor import records as jobrecord
from slurmtf.slurm.controller import ControllerSilent, patient, persist, repeatable, silence
from tests.helpers.fakeslurm import FakeSlurm

DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
NO_CONF = (
    "scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
    "scontrol: error: fetch_config: DNS SRV lookup failed\n"
    "scontrol: error: _establish_config_source: failed to fetch config\n"
    "scontrol: fatal: Could not establish a configuration source"
)


@pytest.mark.parametrize(
    ("stderr", "words", "no_config", "maybe_arrived"),
    [
        (DOWN, "Unable to contact slurm controller (connect failure)", False, False),
        (
            "sbatch: error: Batch job submission failed: Unable to contact slurm controller "
            "(connect failure)",
            "Unable to contact slurm controller (connect failure)",
            False,
            False,
        ),
        (
            "scancel: error: Kill job error on job id 7: Unable to contact slurm controller "
            "(send failure)",
            "Unable to contact slurm controller (send failure)",
            False,
            True,
        ),
        (
            "squeue: error: slurm_receive_msg: Unable to contact slurm controller (receive "
            "failure)",
            "Unable to contact slurm controller (receive failure)",
            False,
            True,
        ),
        (
            "slurm_load_jobs error: Socket timed out on send/recv operation",
            "Socket timed out on send/recv operation",
            False,
            True,
        ),
        (
            "slurm_load_jobs error: Zero Bytes were transmitted or received",
            "Zero Bytes were transmitted or received",
            False,
            True,
        ),
        (NO_CONF, "Could not establish a configuration source", True, False),
        (
            "scontrol: error: Unable to establish controller machine",
            "Unable to establish controller machine",
            True,
            False,
        ),
    ],
)
def test_silence_reads_slurms_words(
    stderr: str, words: str, no_config: bool, maybe_arrived: bool
) -> None:
    found = silence(stderr)
    assert found is not None
    assert (found.words, found.no_config, found.maybe_arrived) == (words, no_config, maybe_arrived)
    assert "SLURM_CONF" in found.hint() if no_config else "scontrol ping" in found.hint()


@pytest.mark.parametrize(
    "stderr",
    [
        "slurm_load_jobs error: Invalid job id specified",
        "sbatch: error: Batch job submission failed: Invalid partition name specified",
        "timed out after 60 s",  # the runner's own timeout: a step, not the controller
        "",
    ],
)
def test_other_errors_are_answers(stderr: str) -> None:
    assert silence(stderr) is None


@pytest.mark.parametrize(
    ("args", "safe"),
    [
        (["squeue", "-j", "7"], True),
        (["scontrol", "-o", "show", "job", "7"], True),
        (["scontrol", "ping"], True),
        (["scancel", "7"], True),
        (["/opt/slurm/bin/sacct", "-j", "7"], True),
        (["scontrol", "requeue", "7"], False),
        (["sbatch", "--parsable", "job.sbatch"], False),
        (["srun", "hostname"], False),
        ([], False),
    ],
)
def test_repeatable(args: list[str], safe: bool) -> None:
    assert repeatable(args) is safe


class Clock:
    """A fake monotonic clock that sleeps advance."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_patient_retries_a_connect_failure_then_succeeds() -> None:
    clock = Clock()
    fake = FakeSlurm({"scancel": [(1, "", DOWN), (1, "", DOWN), (0, "", "")]})
    run = patient(fake, clock=lambda: clock.now, sleep=clock.sleep)
    assert run(["scancel", "7"]) == ""
    assert len(fake.calls) == 3
    assert clock.slept == [1.0, 2.0]


def test_patient_gives_up_within_its_budget_and_names_the_command() -> None:
    clock = Clock()
    fake = FakeSlurm({"squeue": [(1, "", DOWN)]})
    run = patient(fake, clock=lambda: clock.now, sleep=clock.sleep)
    with pytest.raises(ControllerSilent) as caught:
        run(["squeue", "-j", "123"])
    assert len(fake.calls) == 3
    assert sum(clock.slept) <= 5.0
    text = str(caught.value)
    assert "command='squeue -j 123' got no answer from slurmctld (3 tries in 3 s)" in text
    assert "Unable to contact slurm controller (connect failure)" in text
    assert "HINT:" in text
    assert "scontrol ping" in text
    assert isinstance(caught.value, SlurmCommandError)


def test_a_command_that_waited_messagetimeout_is_not_tried_again() -> None:
    clock = Clock()
    fake = FakeSlurm({"squeue": [(1, "", DOWN)]})

    def slow(args: Sequence[str], **kwargs: Any) -> str:
        clock.now += 10.0  # Slurm's own retry for MessageTimeout
        return fake(args, **kwargs)

    with pytest.raises(ControllerSilent):
        patient(slow, clock=lambda: clock.now, sleep=clock.sleep)(["squeue"])
    assert len(fake.calls) == 1
    assert clock.slept == []


def test_no_configuration_is_not_retried() -> None:
    clock = Clock()
    fake = FakeSlurm({"scancel": [(1, "", NO_CONF)]})
    with pytest.raises(ControllerSilent) as caught:
        patient(fake, clock=lambda: clock.now, sleep=clock.sleep)(["scancel", "7"])
    assert len(fake.calls) == 1
    assert "found no Slurm configuration" in str(caught.value)
    assert "SLURM_CONF" in str(caught.value)


def test_a_submission_that_may_have_arrived_is_not_repeated() -> None:
    clock = Clock()
    timed_out = (
        "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation"
    )
    calls: list[int] = []

    def submit() -> str:
        calls.append(1)
        raise SlurmCommandError("sbatch", 1, timed_out)

    with pytest.raises(ControllerSilent) as caught:
        persist(
            submit, ["sbatch"], asked="sbatch of job 'x'", clock=lambda: clock.now,
            sleep=clock.sleep,
        )  # fmt: skip
    assert calls == [1]
    assert "command=\"sbatch of job 'x'\"" in str(caught.value)
    assert "squeue --me" in str(caught.value)


def test_other_errors_pass_through_at_once() -> None:
    fake = FakeSlurm({"scancel": [(1, "", "scancel: error: Invalid job id 99")]})
    with pytest.raises(SlurmCommandError) as caught:
        patient(fake, sleep=lambda _: None)(["scancel", "99"])
    assert not isinstance(caught.value, ControllerSilent)
    assert len(fake.calls) == 1


def test_cancel_says_the_controller_did_not_answer(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeSlurm({"scancel": [(1, "", NO_CONF)]})
    assert jobs_cli.main(["cancel", "7"], runner=fake) == 1
    err = capsys.readouterr().err
    assert "slurmtf cancel: command='scancel 7' found no Slurm configuration" in err
    assert "HINT:" in err


def _finished_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A job 7 that finished at step 20: the user's record and rank logs as job scripts
    write them."""
    logs = tmp_path / "logs"
    logs.mkdir()
    for rank in (0, 1):
        events = [
            {"event": "cluster", "rank": rank, "global_batch": 64},
            {"event": "progress", "rank": rank, "step": 20, "total": 20, "examples_per_sec": 9.0},
            {"event": "done", "rank": rank, "step": 20},
            {"event": "exit", "rank": rank, "status": 0},
        ]
        (logs / f"rank{rank}.out").write_text("".join(json.dumps(e) + "\n" for e in events))
        (logs / f"rank{rank}.err").write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    jobrecord.append("7", logs, SCRIPT_LOG_NAME, "mnist")
    return logs


@pytest.mark.parametrize(("stderr", "sacct_asked"), [(DOWN, True), (NO_CONF, False)])
def test_status_answers_from_the_record_and_logs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stderr: str,
    sacct_asked: bool,
) -> None:
    logs = _finished_job(tmp_path, monkeypatch)
    fake = FakeSlurm({"scontrol": [(1, "", stderr)], "sacct": [(1, "", stderr)]})
    assert jobs_cli.main(["status", "7"], runner=fake) == 0
    out = capsys.readouterr().out
    assert "job 7: rank 0 logged 'finished' at step 20, exit status 0 (rank 0's log)" in out
    assert "step 20/20" in out
    assert f"logs (2 rank(s) in {logs}, found via record)" in out
    silent = [line for line in out.splitlines() if "Slurm did not answer" in line]
    assert len(silent) == 1, out
    assert "`scontrol -o show job 7`" in silent[0]
    assert [c[0] for c in fake.calls].count("scontrol") == 1  # asked once
    assert ("sacct" in [c[0] for c in fake.calls]) is sacct_asked


def test_status_takes_accounting_when_only_the_controller_is_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _finished_job(tmp_path, monkeypatch)
    fake = FakeSlurm({"scontrol": [(1, "", DOWN)], "sacct": [(0, "7|COMPLETED|0:0\n", "")]})
    assert jobs_cli.main(["status", "7"], runner=fake) == 0
    out = capsys.readouterr().out
    assert "job 7: COMPLETED (exit 0:0) [sacct]" in out
    assert "Slurm did not answer" in out


def test_status_with_log_dir_answers_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = _finished_job(tmp_path, monkeypatch)
    fake = FakeSlurm({"scontrol": [(1, "", NO_CONF)]})
    assert jobs_cli.main(["status", "7", f"--log_dir={logs}"], runner=fake) == 0
    out = capsys.readouterr().out
    assert "exit status 0" in out
    assert "found via given" in out


@pytest.mark.parametrize("stderr", [DOWN, NO_CONF])
def test_logs_answer_from_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    stderr: str,
) -> None:  # fmt: skip
    _finished_job(tmp_path, monkeypatch)
    fake = FakeSlurm({"scontrol": [(1, "", stderr)]})
    assert jobs_cli.main(["logs", "7", "--rank=1"], runner=fake) == 0
    captured = capsys.readouterr()
    assert "done at step 20" in captured.out
    assert captured.err.count("Slurm did not answer") == 1
    assert len(fake.calls) == 1


def test_other_scontrol_errors_still_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _finished_job(tmp_path, monkeypatch)
    fake = FakeSlurm({"scontrol": [(1, "", "scontrol: error: Access/permission denied")]})
    assert jobs_cli.main(["status", "7"], runner=fake) == 1
    assert "permission denied" in capsys.readouterr().err


def test_follow_rank_goes_on_through_a_failover(tmp_path: Path) -> None:
    from slurmtf.monitor.status import follow_rank

    log = tmp_path / "r0.out"
    log.write_text("hello\n")
    fake = FakeSlurm(
        {
            "scontrol": [
                (1, "", DOWN),
                (1, "", DOWN),
                (0, "JobId=7 JobState=COMPLETED ExitCode=0:0\n", ""),
            ]
        }
    )
    out = io.StringIO()
    assert follow_rank("7", log, fake, out=out, sleep=lambda _: None) == 0
    assert len(fake.calls) == 4  # two silent polls, then the final state twice
    fake = FakeSlurm({"scontrol": [(1, "", NO_CONF)]})
    with pytest.raises(ControllerSilent):
        follow_rank("7", log, fake, out=out, sleep=lambda _: None)


def test_array_status_answers_from_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for task in (0, 1):
        logs = tmp_path / f"point{task}"
        logs.mkdir()
        (logs / "rank0.out").write_text('{"event": "exit", "rank": 0, "status": 0}\n')
        jobrecord.append(f"8_{task}", logs, SCRIPT_LOG_NAME, "sweep")
    fake = FakeSlurm({"scontrol": [(1, "", DOWN)]})
    assert jobs_cli.main(["status", "8"], runner=fake) == 0
    captured = capsys.readouterr()
    assert "8_0" in captured.out
    assert "8_1" in captured.out
    assert "COMPLETED" in captured.out
    assert captured.err.count("Slurm did not answer") == 1
    assert len(fake.calls) == 1
