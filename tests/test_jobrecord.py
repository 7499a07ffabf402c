"""Finding a job's logs by its id: Slurm's record, the user's jobs.jsonl, and status."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from slurmtf.cli import jobs as jobs_cli
from slurmtf.contracts import SCRIPT_LOG_NAME
from slurmtf.monitor import records as jobrecord
from slurmtf.monitor import status as watch
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.runtime.job.supervisor import record_job
from slurmtf.slurm.scontrol import parse_records
from tests.helpers.fakeslurm import GONE, NO_ACCT, FakeSlurm


@pytest.fixture
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)  # not the folder the job wrote to
    return tmp_path / "state" / "slurmtf" / "jobs.jsonl"


def write_run(folder: Path) -> None:
    """What a two-rank job script run leaves: event lines and stderr per rank."""
    folder.mkdir(parents=True)
    chief = [
        {"event": "cluster", "rank": 0, "global_batch": 32, "restart_count": 0},
        {"event": "progress", "step": 10, "total": 100, "examples_per_sec": 64.0},
        {"event": "cluster", "rank": 0, "global_batch": 32, "restart_count": 1},
        {"event": "progress", "step": 40, "total": 100, "examples_per_sec": 32.0},
    ]
    (folder / "rank0.out").write_text("".join(json.dumps(e) + "\n" for e in chief))
    (folder / "rank0.err").write_text("12:00:01 rank0 I step 40/100\n")
    (folder / "rank1.out").write_text("")
    (folder / "rank1.err").write_text(
        "E0000 noise\nmodels.mnist: a peer failed, stalled or timed out - lost rank 0. HINT: x\n"
    )


def test_the_job_script_records_its_log_dir_and_status_finds_it(
    state_home: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "run dir" / "logs"
    write_run(logs)
    environ = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": 'a "quoted" name',
               "LOG_DIR": str(logs), "XDG_STATE_HOME": str(tmp_path / "state")}  # fmt: skip
    job = JobSettings.read("mnist", environ)
    calls = FakeSlurm({})
    record_job(job, calls, environ)
    record_job(job, calls, environ)
    lines = state_home.read_text().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[0])["log_dir"] == str(logs)
    assert json.loads(lines[0])["name"] == 'a "quoted" name'
    assert ["scontrol", "update", "JobId=4242", f"Comment=slurmtf:{logs}"] in calls.calls

    fake = FakeSlurm({"scontrol": [GONE], "sacct": [NO_ACCT]})
    place = watch.locate("4242", fake)
    assert (place.log_dir, place.source) == (logs, "record")
    text = "\n".join(watch.status_lines("4242", fake, place))
    assert "restarts 1" in text
    # step 40 of 100 at 32 examples/s with a global batch of 32: 60 steps of 1 s
    assert "step 40/100, 32.0 examples/s, ETA 1m00s" in text
    assert "last error, rank 1: models.mnist: a peer failed" in text


def test_slurm_record_wins_while_slurm_knows_the_job(state_home: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_run(logs)
    jobrecord.append("99", tmp_path / "elsewhere", SCRIPT_LOG_NAME, path=state_home)
    show = f"JobId=99 JobState=RUNNING ExitCode=0:0 Restarts=2 Comment=slurmtf:{logs}\n"
    fake = FakeSlurm({"scontrol": [(0, show, "")]})
    assert jobs_cli.main(["logs", "99", "--rank=1", "--err"], runner=fake) == 0
    place = watch.locate("99", fake)
    assert (place.log_dir, place.source) == (logs, "slurm")
    assert watch.status_lines("99", fake, place)[0] == (
        "job 99: RUNNING (exit 0:0) [scontrol], restarts 2"
    )


def test_a_submitit_job_is_found_through_its_stdout(tmp_path: Path) -> None:
    show = f"JobId=5 JobState=PENDING StdOut={tmp_path}/5_0_log.out\n"
    place = jobrecord.from_slurm("5", parse_records(show)[0])
    assert place is not None
    assert place.rank_log(3, "err") == tmp_path / "5_3_log.err"


def test_the_record_stays_bounded_and_keeps_the_newest(
    state_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobrecord, "MAX_BYTES", 4000)
    for job in range(200):
        jobrecord.append(str(job), Path(f"/logs/{job}"), SCRIPT_LOG_NAME, path=state_home)
    assert state_home.stat().st_size <= 4000
    found = jobrecord.lookup("199", state_home)
    assert found is not None
    assert found.log_dir == Path("/logs/199")
    assert jobrecord.lookup("0", state_home) is None
    assert all(json.loads(line) for line in state_home.read_text().splitlines())


def test_an_unknown_job_says_where_it_looked(
    state_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeSlurm({"scontrol": [GONE], "sacct": [NO_ACCT]})
    assert jobs_cli.main(["logs", "31337"], runner=fake) == 2
    err = capsys.readouterr().err
    assert "JOB='31337'" in err
    assert "found via default" in err
    assert "HINT:" in err


def test_logs_follow_prints_the_rank_file_until_the_job_ends(tmp_path: Path) -> None:
    log = tmp_path / "rank1.out"
    log.write_text("first\n")
    answers = [(0, "JobId=8 JobState=RUNNING\n", ""), (0, "JobId=8 JobState=COMPLETED\n", "")]
    fake = FakeSlurm({"scontrol": answers})
    out = io.StringIO()

    def grow(_: float) -> None:
        with log.open("a") as handle:
            handle.write("second\n")

    assert watch.follow_rank("8", log, fake, out=out, sleep=grow) == 0
    assert out.getvalue().startswith("first\nsecond\n"), out.getvalue()
