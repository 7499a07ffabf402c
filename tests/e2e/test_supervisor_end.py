"""The supervisor's own end does not end or hang the job, and nothing of it is left.

Light 2-node ``sbatch jobs/train.sbatch tests/scripts/steady.py`` jobs (no TensorFlow:
a rank steps, checkpoints and resumes) run at once on a sandbox of their own. Mid-run:

* ``kill``: the supervisor gets SIGKILL (as from the OOM killer);
* ``stop``: the supervisor alone gets SIGSTOP (alive but stuck);
* ``raise``: the supervisor dies of an uncaught exception (``tests/helpers/crash_once``,
  a stand-in for a bug, put on ``PYTHONPATH``).

Each time its keeper starts it again in the same allocation (Slurm's Restarts stays 0),
the job resumes from the checkpoint and ends COMPLETED at the last step, and the job's
log and ``slurmtf status`` say how the supervisor ended; for ``stop`` the watcher on the
other node said it first. Then no process of any job is left (``pgrep`` and ``/proc``):
after COMPLETED, after FAILED (a rank's bad flag) and after ``scancel``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, SlurmSandbox, module_sandbox
from tests.e2e.jobruns import (
    SandboxJob,
    batch_side,
    event_step,
    first_count,
    no_process_left,
    record_lines,
    trained_in_start,
    wait_until,
)

pytestmark = [pytest.mark.slurm]

STEADY = REPO / "tests" / "scripts" / "steady.py"
CRASH = REPO / "tests" / "helpers" / "crash_once"
STEPS = 60
BEAT_S = 2  # SLURMTF_HEARTBEAT_S: the keeper ends a silent supervisor after 6 beats
# how -> what the job's log says of the supervisor's end
SAID = {
    "kill": r"the supervisor \(pid (\d+) on (node\d+)\) was killed by SIGKILL \(the OOM killer "
    r"or kill -9\) at \S+",
    "stop": r"the supervisor \(pid (\d+) on (node\d+)\) stopped beating at \S+ \(stopped or "
    r"hung\); its keeper killed it \d+ s later",
    "raise": r"the supervisor \(pid (\d+) on (node\d+)\) died of an uncaught exception at \S+: "
    r"RuntimeError: a bug in the supervisor \(the test's stand-in\)",
}
ENDINGS = ("completed", "failed", "cancelled")


@pytest.fixture(scope="module")
def own_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    """Ten nodes without GPUs: every job of this module runs at once."""
    yield from module_sandbox(tmp_path_factory, "ends", nodes=10, gpus_per_node=0)


def submit(sandbox: SlurmSandbox, root: Path, name: str, *args: str, **env: str) -> SandboxJob:
    job = SandboxJob(sandbox, root / name)
    model = job.run_dir / "model"
    job.submit([str(STEADY), f"--model_dir={model}", f"--steps={STEPS}", "--step_s=0.5", *args],
               script="train.sbatch", sbatch_args=["--gres=none"],
               env={"MAX_RESTARTS": "2", "SLURMTF_HEARTBEAT_S": str(BEAT_S),
                    "XDG_STATE_HOME": str(root / "state"),
                    **env})  # fmt: skip
    return job


@dataclasses.dataclass
class Broken:
    """A job whose supervisor the module ended: its PID, when, and when rank 0 trained
    again (seconds after)."""

    pid: int = 0
    at: float = 0.0
    again: float | None = None


@pytest.fixture(scope="module")
def jobs(own_sandbox: SlurmSandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
    dict[str, SandboxJob]
]:  # fmt: skip
    """Every job of the module, submitted at once; cancelled at the end."""
    root = tmp_path_factory.mktemp("supervisor")
    (root / "state").mkdir()
    crash = {"PYTHONPATH": f"{CRASH}:{REPO}", "SLURMTF_TEST_CRASH_ONCE": str(root / "crashed"),
             "SLURMTF_TEST_CRASH_AFTER_S": "12"}  # fmt: skip
    made = {
        "kill": submit(own_sandbox, root, "kill"),
        "stop": submit(own_sandbox, root, "stop"),
        "raise": submit(own_sandbox, root, "raise", **crash),
        "failed": submit(own_sandbox, root, "failed", "--steps=many"),
        "cancelled": submit(own_sandbox, root, "cancelled"),
    }
    yield made
    for job in made.values():
        job.cancel()
        job.release()


@pytest.fixture(scope="module")
def broken(own_sandbox: SlurmSandbox, jobs: dict[str, SandboxJob]) -> dict[str, Broken]:
    """At step 10, SIGKILL (``kill``) or SIGSTOP (``stop``) each job's supervisor, both
    jobs at once; at step 5, ``scancel`` the ``cancelled`` job. Returns when each broken
    job trained again (or after 240 s)."""
    signals = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}
    found = {name: Broken() for name in signals}
    deadline = time.monotonic() + 240
    cancelled = False
    while time.monotonic() < deadline:
        for name, how in signals.items():
            job, what = jobs[name], found[name]
            out = job.log_dir / "rank0.out"
            if not what.pid and event_step(out) >= 10:
                what.pid, what.at = batch_side(job.log_dir, job.job_id).pid, time.monotonic()
                os.kill(what.pid, how)
            elif what.pid and what.again is None and trained_in_start(out, 2):
                what.again = time.monotonic() - what.at
        if not cancelled and event_step(jobs["cancelled"].log_dir / "rank0.out") >= 5:
            own_sandbox.run(["scancel", jobs["cancelled"].job_id])
            cancelled = True
        if cancelled and all(what.again is not None for what in found.values()):
            break
        time.sleep(0.2)
    return found


def check_restarted(sandbox: SlurmSandbox, job: SandboxJob, how: str, pid: int | None) -> str:
    """COMPLETED in its allocation, resumed from the checkpoint, said; the line."""
    assert job.wait(180) == "COMPLETED", job.report()
    show = sandbox.run(["scontrol", "show", "job", job.job_id]).stdout
    assert "Restarts=0 " in show, show
    starts = job.events(0, "cluster")
    assert [c["restart_count"] for c in starts] == [0, 1], starts
    assert starts[-1]["start_step"] > 0, starts  # from the checkpoint
    assert job.events(0, "done")[-1]["step"] == STEPS, job.report()
    said = re.search(SAID[how], job.job_output())
    assert said, job.job_output()
    if pid is not None:
        assert said.group(1) == str(pid)
    line = re.search(r"restart 1 in place \(" + first_count("2") + rf", MAX_RESTARTS\), \d+\.\d s "
                     rf"after {SAID[how]}",
                     job.job_output())  # fmt: skip
    assert line, job.job_output()
    status = record_lines(sandbox, job.job_id, job.run_dir.parent / "state")[0]
    assert line.group(0) in status, status
    return line.group(0)


@pytest.mark.matrix
def test_a_killed_supervisor_is_started_again_in_place(
    own_sandbox: SlurmSandbox, jobs: dict[str, SandboxJob], broken: dict[str, Broken]
) -> None:
    job, what = jobs["kill"], broken["kill"]
    assert what.again is not None, job.report()
    print(f"MEASURED supervisor SIGKILL -> training again {what.again:.1f} s (light ranks)")
    check_restarted(own_sandbox, job, "kill", what.pid)
    assert "ending the step(s) " in job.job_output()  # the old step, on every node


def test_a_stopped_supervisor_is_noticed_by_the_watcher_and_started_again(
    own_sandbox: SlurmSandbox, jobs: dict[str, SandboxJob], broken: dict[str, Broken]
) -> None:
    job, what = jobs["stop"], broken["stop"]
    assert what.again is not None, job.report()
    print(f"MEASURED supervisor SIGSTOP -> training again {what.again:.1f} s (light ranks)")
    check_restarted(own_sandbox, job, "stop", what.pid)
    noticed = (rf"watcher: the supervisor on node\d+ has not beaten for \d+ s, but node\d+ "
               rf"answers: its keeper ends a supervisor silent for {6 * BEAT_S} s")  # fmt: skip
    assert re.search(noticed, job.job_output()), job.job_output()
    assert job.job_output().index("has not beaten") < job.job_output().index("stopped beating")


def test_a_supervisor_that_dies_of_an_exception_is_started_again(
    own_sandbox: SlurmSandbox, jobs: dict[str, SandboxJob]
) -> None:
    job = jobs["raise"]
    wait_until(job, lambda: trained_in_start(job.log_dir / "rank0.out", 2), 240, "a restart")
    check_restarted(own_sandbox, job, "raise", None)
    assert "Traceback (most recent call last)" in job.job_output()


@pytest.mark.parametrize("ending", ENDINGS)
def test_nothing_of_a_job_is_left_once_it_ended(
    jobs: dict[str, SandboxJob], broken: dict[str, Broken], ending: str
) -> None:
    """No keeper, supervisor, watcher, srun, step daemon or rank of the job."""
    job = {"completed": jobs["kill"], "failed": jobs["failed"],
           "cancelled": jobs["cancelled"]}[ending]  # fmt: skip
    if ending == "cancelled":
        assert broken  # cancelled at step 5
        assert "watcher on node" in job.job_output(), job.job_output()
    assert job.wait(180) == ending.upper(), job.report()
    assert no_process_left(job.job_id) == [], job.report()
    assert not re.search(r"requeueing job|cancelling job", job.job_output()), job.job_output()
