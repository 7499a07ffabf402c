"""The keeper's death (slurmtf/runtime/batch_host/keeper_death.py, succession.keeper_died): a forked
supervisor sees its parent killed within a second (PR_SET_PDEATHSIG), or gone already
(getppid); it then records the decision, marks its heartbeat, ends the job's steps and
requeues the job within MAX_RESTARTS; ps tells the keeper and the supervisor apart.
Real processes for the first; a fake Slurm runner for the rest."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from slurmtf.runtime.batch_host import keeper_death
from slurmtf.runtime.batch_host.succession import keeper_died
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.runtime.recovery.record import batch_side_lines, read_record

ROOT = Path(__file__).resolve().parents[1]

# A parent that forks: the child watches it, then writes "gone <seconds>" when it sees it
# go; the parent writes the child's pid and sleeps (killed by the test), or, with
# "early", exits before the child watches it.
FORKER = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
from slurmtf.runtime.batch_host.keeper_death import keeper_gone, watch_keeper
out, early = sys.argv[2], sys.argv[3] == "early"
parent = os.getpid()
pid = os.fork()
if pid == 0:
    if early:
        time.sleep(0.5)  # the parent is gone by now
    watch_keeper(parent)
    with open(out + ".ready", "w") as f:
        f.write(str(os.getpid()))
    deadline = time.monotonic() + 10
    while keeper_gone() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    seen = keeper_gone()
    with open(out, "w") as f:
        f.write(f"gone {time.time() - seen:.3f} {seen:.3f}" if seen else "alive")
    os._exit(0)
if early:
    os._exit(0)
time.sleep(30)
"""


def _wait_for(path: Path, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.01)
    return ""


def test_a_killed_parent_is_seen_within_a_second(tmp_path: Path) -> None:
    out = tmp_path / "seen"
    parent = subprocess.Popen([sys.executable, "-c", FORKER, str(ROOT), str(out), "late"])
    try:
        assert _wait_for(Path(f"{out}.ready"), 20)
        killed = time.time()
        parent.send_signal(signal.SIGKILL)
        parent.wait(5)
        said = _wait_for(out, 5)
    finally:
        if parent.poll() is None:
            parent.kill()
    assert said.startswith("gone "), said
    assert float(said.split()[2]) - killed < 1.0  # seen within a second of the kill


def test_a_parent_gone_before_the_child_watches_is_seen_at_once(tmp_path: Path) -> None:
    out = tmp_path / "seen"
    parent = subprocess.Popen([sys.executable, "-c", FORKER, str(ROOT), str(out), "early"])
    parent.wait(20)
    said = _wait_for(out, 20)
    assert said.startswith("gone "), said
    assert float(said.split()[1]) < 0.5  # getppid() told it before any signal


TITLE = """
import sys, time
sys.path.insert(0, sys.argv[1])
from slurmtf.runtime.batch_host.keeper_death import set_title
set_title("slurmtf job mnist (keeper)", "slurmtf-keeper")
print("titled", flush=True)
time.sleep(30)
"""


def test_ps_tells_the_keeper_by_its_title() -> None:
    args = [sys.executable, "-c", TITLE, str(ROOT), "--a=long-enough-command-line"]
    with subprocess.Popen(args, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "titled\n"
            ps = ["ps", "-o", "comm=,args=", "-p", str(proc.pid)]
            shown = subprocess.run(ps, capture_output=True, text=True, check=True).stdout
        finally:
            proc.kill()
    comm, _, command = shown.strip().partition(" ")
    assert comm == "slurmtf-keeper"
    assert command.strip() == "slurmtf job mnist (keeper)"


class Slurm:
    """scontrol show job says the batch step ended by ``signal``; the job's steps are
    listed; every call is recorded."""

    def __init__(self, code: str = "0:9") -> None:
        self.code = code
        self.calls: list[str] = []

    def __call__(self, args: Sequence[str], **_: Any) -> str:
        self.calls.append(shlex.join(args))
        if args[:3] == ["scontrol", "show", "job"]:
            return f"JobId=7 JobState=COMPLETING Reason=None ExitCode={self.code} NumNodes=2\n"
        if args[0] == "squeue":  # the steps leave once their tasks got SIGTERM
            return (
                ""
                if "scancel --ctld --signal=TERM 7.0 7.1" in self.calls
                else ("7.0 python3\n7.1 slurmtf-watcher\n")
            )
        return ""


def job(tmp_path: Path, budget: str = "3") -> JobSettings:
    return JobSettings.read("mnist", {
        "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2",
        "SLURMD_NODENAME": "node1", "LOG_DIR": str(tmp_path), "MODEL_DIR": str(tmp_path),
        "MAX_RESTARTS": budget,
    })  # fmt: skip


@pytest.fixture
def gone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keeper_death, "_gone", [1_000_000.0])
    monkeypatch.setattr(keeper_death, "_keeper", [4242])
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # the test's own SIGTERM stays


@pytest.mark.usefixtures("gone")
def test_the_keeper_s_death_requeues_the_job_at_once(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    slurm, marks = Slurm(), []
    assert keeper_died(job(tmp_path), slurm, marks.append) == 0
    assert marks == ["requeueing"]
    term, scancel, requeue = (
        "scancel --ctld --signal=TERM 7.0 7.1",
        "scancel 7.0 7.1",
        "scontrol requeue 7",
    )
    assert slurm.calls.index(term) < slurm.calls.index(scancel) < slurm.calls.index(requeue)
    (record,) = read_record(tmp_path, "7")
    assert (record["kind"], record["action"], record["exclude"]) == ("keeper", "requeue", [])
    (line,) = batch_side_lines([record])
    assert line.startswith("the keeper (pid 4242 on node1), the job's own process, was killed "
                           "by SIGKILL at ")  # fmt: skip
    assert line.endswith(": requeueing job 7 (restart 1, 1 of 3 without progress, MAX_RESTARTS)")
    assert line in capfd.readouterr().err


@pytest.mark.usefixtures("gone")
def test_with_the_budget_spent_the_keeper_s_death_ends_the_job_with_a_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    slurm, marks = Slurm(code="0:15"), []
    assert keeper_died(job(tmp_path, budget="0"), slurm, marks.append) == 1
    assert marks == ["stopping"]
    assert not [c for c in slurm.calls if c.startswith(("scontrol requeue", "scancel"))]
    said = capfd.readouterr().err
    assert "the keeper (pid 4242 on node1), the job's own process, was killed by SIGTERM" in said
    assert "the job ends" in said


def test_a_process_that_watches_no_keeper_sees_none() -> None:
    assert keeper_death.watched_keeper() in (0, os.getppid())
    assert keeper_death.keeper_gone() is None
