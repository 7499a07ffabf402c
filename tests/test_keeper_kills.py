"""The keeper killed at each point of a job's life, as ``python -m slurmtf job`` runs it
under a job script: during a step, between steps (the supervisor deciding after a failed
step), and during the supervisor's own restart (the keeper has just started a new one).
Each time the supervisor alive then requeues the job at once, within ``MAX_RESTARTS``,
ends every step it knows of and starts none. Real processes; Slurm's commands are fakes
on PATH that record their calls.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurmtf.runtime.recovery.record import read_record
from tests.test_keeper import alive, supervisor_of, wait_for

JOB = "77"
KILL_WAIT_S = 30  # Slurm ends an orphaned supervisor by then: "at once" is well before it
Start = Callable[[str], "Job"]
FAKES = {
    # The step: its pid recorded; the first one fails like a killed rank when MODE=fail,
    # every other one runs until it is ended. A probe (--overlap) answers at once.
    "srun": """
for arg in "$@"; do [ "$arg" = --overlap ] && exit 0; done
echo $$ >> "$WORK/sruns"
if [ "$MODE" = fail ] && [ "$(wc -l < "$WORK/sruns")" -eq 1 ]; then
    echo "srun: error: node2: task 1: Killed" >&2
    exit 137
fi
exec sleep 300
""",
    # Asked for drained nodes while the supervisor decides after a failed step.
    "sinfo": 'touch "$WORK/deciding"; sleep "${SINFO_SLEEP:-0}"\n',
    "scontrol": """
if [ "$1 $2" = "show job" ] || [ "$2 $3" = "show job" ]; then
    echo "JobId=77 JobName=x JobState=RUNNING Reason=None ExitCode=0:9 Restarts=0 NumNodes=2"
    echo "   NodeList=node[1-2] ExcNodeList=(null)"
fi
""",
    "squeue": '[ -e "$WORK/cancelled" ] || echo "77.0 python3"\n',
    "scancel": 'touch "$WORK/cancelled"\n',
}


def start_job(tmp_path: Path, mode: str) -> subprocess.Popen[bytes]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKES.items():
        fake = bin_dir / name
        fake.write_text(f'#!/bin/bash\necho "{name} $*" >> "$WORK/calls"\n{body}')
        fake.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parents[1]),
        "WORK": str(tmp_path), "MODE": mode, "SINFO_SLEEP": "0.5",
        "LOG_DIR": str(tmp_path / "logs"), "MODEL_DIR": str(tmp_path / "model"),
        "SLURM_JOB_ID": JOB, "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2",
        "SLURMD_NODENAME": "node1", "MAX_RESTARTS": "3", "SLURMTF_HEARTBEAT_S": "0.5",
        "SLURMTF_WATCHER": "0", "SLURMTF_WARM_STANDBY": "0", "SLURMTF_NODE_WATCH_S": "0.2",
    }  # fmt: skip
    command = [sys.executable, "-m", "slurmtf", "job", "command", "--", "train"]
    with (tmp_path / "job.out").open("wb") as out:  # the supervisor outlives the keeper
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


def calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


def sruns(tmp_path: Path) -> list[int]:
    path = tmp_path / "sruns"
    return [int(pid) for pid in path.read_text().split()] if path.exists() else []


def kill_keeper(keeper: subprocess.Popen[bytes]) -> float:
    killed = time.monotonic()
    keeper.kill()
    keeper.wait()
    return killed


def requeued_within(tmp_path: Path, killed: float, supervisor: int) -> float:
    """Seconds from the keeper's kill to the supervisor's ``scontrol requeue``; the
    supervisor has ended by then."""
    wait_for(lambda: f"scontrol requeue {JOB}" in calls(tmp_path), 2 * KILL_WAIT_S)
    seconds = time.monotonic() - killed
    wait_for(lambda: not alive(supervisor), 30)
    print(f"MEASURED keeper killed -> scontrol requeue: {seconds:.2f} s")
    return seconds


def keeper_record(tmp_path: Path, keeper: int) -> dict[str, object]:
    records = read_record(tmp_path / "logs", JOB)
    assert records, "no decision recorded"
    assert records[-1]["kind"] == "keeper", records
    last = records[-1]
    assert last["action"] == "requeue", last
    assert str(last["line"]).startswith(
        f"the keeper (pid {keeper} on node1), the job's own process, was killed by SIGKILL at "
    ), last
    return last


class Job:
    """The test's job: its keeper, and every supervisor seen, so that none outlives the
    test (:meth:`end`)."""

    def __init__(self, tmp_path: Path, mode: str) -> None:
        self.tmp_path = tmp_path
        self.keeper = start_job(tmp_path, mode)
        self.supervisors: list[int] = []

    def supervisor(self) -> int:
        """The keeper's supervisor, once one that was not seen before runs."""

        def new() -> int | None:
            pid = supervisor_of(self.keeper.pid)
            return pid if pid not in (None, *self.supervisors) else None

        self.supervisors.append(wait_for(new))
        return self.supervisors[-1]

    def end(self) -> None:
        if self.keeper.poll() is None:
            self.keeper.kill()
        self.keeper.wait()
        for pid in self.supervisors:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in sruns(self.tmp_path):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Callable[[str], Job]]:
    """Starts the test's job; every process it started is gone at the end."""
    jobs: list[Job] = []

    def start(mode: str) -> Job:
        jobs.append(Job(tmp_path, mode))
        return jobs[-1]

    yield start
    for started in jobs:
        started.end()


def test_a_keeper_killed_during_a_step_requeues_the_job(tmp_path: Path, job: Start) -> None:
    run = job("run")
    supervisor = run.supervisor()
    wait_for(lambda: bool(sruns(tmp_path)))
    seconds = requeued_within(tmp_path, kill_keeper(run.keeper), supervisor)
    assert seconds < KILL_WAIT_S, f"the requeue came {seconds:.1f} s after the keeper's death"
    record = keeper_record(tmp_path, run.keeper.pid)
    assert str(record["line"]).endswith(
        f": requeueing job {JOB} (restart 1, 1 of 3 without progress, MAX_RESTARTS)"
    ), record
    assert "scancel 77.0" in calls(tmp_path), "the job's steps are ended"
    assert not [pid for pid in sruns(tmp_path) if alive(pid)], "the step's srun is ended"


def test_a_keeper_killed_between_steps_requeues_the_job_instead_of_a_new_step(
    tmp_path: Path, job: Start
) -> None:
    """The step failed and the supervisor is deciding (asking sinfo for drained nodes)
    when the keeper is killed: the restart in place it decides on never starts a step;
    the job is requeued, both decisions recorded, each counted once."""
    run = job("fail")
    supervisor = run.supervisor()
    wait_for((tmp_path / "deciding").exists)
    seconds = requeued_within(tmp_path, kill_keeper(run.keeper), supervisor)
    assert seconds < KILL_WAIT_S, f"the requeue came {seconds:.1f} s after the keeper's death"
    assert len(sruns(tmp_path)) == 1, "a step was started after the keeper's death"
    records = read_record(tmp_path / "logs", JOB)
    assert [r["action"] for r in records] == ["restart", "requeue"], records
    record = keeper_record(tmp_path, run.keeper.pid)
    assert str(record["line"]).endswith(
        f": requeueing job {JOB} (restart 2, 2 of 3 without progress, MAX_RESTARTS)"
    ), record


def test_a_keeper_killed_during_the_supervisors_restart_requeues_the_job(
    tmp_path: Path, job: Start
) -> None:
    """The supervisor SIGKILLed; the keeper starts another and is killed at once: the new
    supervisor records its predecessor's end, then requeues the job, and no step is left."""
    run = job("run")
    first = run.supervisor()
    wait_for(lambda: bool(sruns(tmp_path)))
    os.kill(first, signal.SIGKILL)
    second = run.supervisor()
    seconds = requeued_within(tmp_path, kill_keeper(run.keeper), second)
    assert seconds < KILL_WAIT_S, f"the requeue came {seconds:.1f} s after the keeper's death"
    records = read_record(tmp_path / "logs", JOB)
    assert [r["kind"] for r in records][-1:] == ["keeper"], records
    assert any(f"the supervisor (pid {first} on node1) was killed by SIGKILL" in str(r["line"])
               for r in records), records  # fmt: skip
    keeper_record(tmp_path, run.keeper.pid)
    assert not [pid for pid in sruns(tmp_path) if alive(pid)], "a step was left running"
    said = (tmp_path / "job.out").read_text()
    assert "the keeper starts it again" in said, said
