"""The keeper killed in the user's shape: jobs of several minutes (2-node MNIST), the
default heartbeat, on three launch paths, each keeper SIGKILLed at another point of the
job's life. Not in CI's run (``long``): ``pytest -m long tests/e2e/test_user_shape_keeper.py``,
on each Slurm release (``SLURMTF_SLURM_PREFIX``).

* ``step``: ``sbatch -N2 -w node1,node2 jobs/mnist.sbatch``, the keeper killed during a
  training step;
* ``between``: ``slurmtf submit --model=mnist --nodes=2``: rank 1 killed, then the keeper
  killed between the two steps (the failed step's srun gone, the next not started);
* ``restart``: ``slurmtf submit --command="python -m slurmtf_models.mnist ..."``: the
  supervisor killed, then the keeper as soon as the supervisor it started again beats.

Each job is requeued by its supervisor at once (the parent-death signal), resumes from the
survivors' memory (at most one step redone), and ends COMPLETED at its last step; its log
names the keeper and the signal; no node is drained and nothing of the job is left. Prints
``MEASURED`` lines (the kill to training again, the steps redone).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurmtf.events import named, read_events
from tests.e2e.conftest import PYTHON, REPO, SlurmSandbox, module_sandbox
from tests.e2e.jobruns import batch_side, event_step, no_process_left, rank_pids
from tests.helpers.procs import children_of

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.long, pytest.mark.tf]

STEPS = 600
KILL_AT = 180  # well after the job's first minutes, far from a periodic save
MNIST = ["--batch_size=16", "--eval_steps=1", "--num_threads=1", "--log_every=1",
         f"--train_steps={STEPS}", "--checkpoint_every=250"]  # fmt: skip
KEEPER = re.compile(
    r"the keeper \(pid (\d+) on (node\d+)\), the job's own process, was killed by SIGKILL"
)


@dataclasses.dataclass
class KeeperJob:
    """One job of the module and when its keeper died."""

    name: str
    job_id: str
    folder: Path  # its log folder (the heartbeat's)
    out: Path  # rank 0's events
    log: Path  # the job's own log
    model: str  # what its ranks run (to find their processes)
    killed_at: float = 0.0
    again: float | None = None
    at_step: int = 0
    keeper: int = 0

    def text(self) -> str:
        """The job's log: the batch script's output (a submitted job's rank 0 files, whose
        stderr holds the supervisor's lines)."""
        logs = [self.log, self.log.with_suffix(".err")] if self.name != "step" else [self.log]
        return "".join(p.read_text(errors="replace") for p in logs if p.exists())


@pytest.fixture(scope="module")
def keeper_shape_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    """Six nodes: the three jobs take two each (a requeue lands where Slurm likes)."""
    yield from module_sandbox(tmp_path_factory, "keepers", nodes=6, slurmd_timeout=60)


def submitted(sandbox: SlurmSandbox, folder: Path, name: str, flags: list[str]) -> KeeperJob:
    folder.mkdir(parents=True)
    done = sandbox.run(
        [PYTHON, "-m", "slurmtf.submit", "--nodes=2", "--time=40", f"--log_dir={folder}",
         "--exclusive", "--max_restarts=3", *flags],
        env={"SLURMTF_WARM_STANDBY": "0"},
        cwd=folder,
    )  # fmt: skip
    found = re.search(r"submitted job (\d+)", done.stdout)
    assert found, done.stdout + done.stderr
    out = folder / f"{found.group(1)}_0_log.out"
    return KeeperJob(name, found.group(1), folder, out, out, "slurmtf_models.mnist")


def start_jobs(sandbox: SlurmSandbox, root: Path) -> dict[str, KeeperJob]:
    run = root / "step"
    run.mkdir()
    jid = sandbox.submit(
        REPO / "jobs" / "mnist.sbatch", *MNIST, f"--model_dir={run / 'model'}",
        sbatch_args=["--time=40", "--exclusive", "-N2", "-w", "node1,node2", "--gres=none",
                     "--ntasks-per-node=1", f"--output={run}/%x-%j.out", "--job-name=step"],
        env={"LOG_DIR": str(run / "logs")},
    )  # fmt: skip
    jobs = {"step": KeeperJob("step", jid, run / "logs", run / "logs" / "rank0.out",
                              run / f"step-{jid}.out", "models.mnist")}  # fmt: skip
    command = (f"{PYTHON} -m slurmtf_models.mnist {' '.join(MNIST)} "
               f"--model_dir={root / 'restart' / 'model'}")  # fmt: skip
    jobs["between"] = submitted(
        sandbox, root / "between", "between", ["--model=mnist", "--", *MNIST]
    )
    jobs["restart"] = submitted(sandbox, root / "restart", "restart", [f"--command={command}"])
    return jobs


def kill_keeper(job: KeeperJob) -> None:
    job.keeper = batch_side(job.folder, job.job_id).keeper
    job.at_step = event_step(job.out)
    os.kill(job.keeper, signal.SIGKILL)
    job.killed_at = time.monotonic()


def between_steps(job: KeeperJob) -> None:
    """Rank 1 killed; the keeper killed once the failed step's srun is gone and before the
    supervisor starts the next (its children polled every 10 ms)."""
    supervisor = batch_side(job.folder, job.job_id).pid
    steps = [p for p, argv in children_of(supervisor) if "srun" in argv and "--overlap" not in argv]
    for pid in rank_pids(job.job_id, 1, job.model):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        running = [p for p, argv in children_of(supervisor) if "srun" in argv
                   and "--overlap" not in argv]  # fmt: skip
        if not set(steps) & set(running):
            break
        time.sleep(0.01)
    kill_keeper(job)
    assert not [p for p, argv in children_of(supervisor) if "srun" in argv
                and "--overlap" not in argv], "the next step had started"  # fmt: skip


def during_restart(job: KeeperJob) -> None:
    """The supervisor killed; the keeper killed once the supervisor it started beats."""
    first = batch_side(job.folder, job.job_id).pid
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while batch_side(job.folder, job.job_id).pid == first and time.monotonic() < deadline:
        time.sleep(0.05)
    kill_keeper(job)


KILLS: dict[str, Callable[[KeeperJob], None]] = {
    "step": kill_keeper,
    "between": between_steps,
    "restart": during_restart,
}


@pytest.fixture(scope="module")
def killed(
    keeper_shape_sandbox: SlurmSandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, KeeperJob]]:
    """Each job's keeper killed once rank 0 passed :data:`KILL_AT`; returns once each
    trained again after it (or after the deadline); the jobs are cancelled afterwards."""
    jobs = start_jobs(keeper_shape_sandbox, tmp_path_factory.mktemp("keepers"))
    deadline = time.monotonic() + 1800
    try:
        while time.monotonic() < deadline:
            for job in jobs.values():
                if not job.killed_at and event_step(job.out) >= KILL_AT:
                    KILLS[job.name](job)
                elif job.killed_at and job.again is None and last_start_trains(job.out):
                    job.again = time.monotonic() - job.killed_at
            if all(job.again is not None for job in jobs.values()):
                break
            time.sleep(0.1)
        yield jobs
    finally:
        for job in jobs.values():
            keeper_shape_sandbox.run(["scancel", job.job_id], check=False)


def last_start_trains(out: Path) -> bool:
    """A requeued start (restart count 1 or more) has trained a step."""
    seen = False
    for event in read_events(out) if out.exists() else []:
        if event.get("event") == "cluster":
            seen = int(event.get("restart_count") or 0) >= 1
        elif seen and event.get("event") == "progress":
            return True
    return False


@pytest.mark.parametrize("name", ["step", "between", "restart"])
def test_a_killed_keeper_costs_a_requeue_and_at_most_one_step(
    keeper_shape_sandbox: SlurmSandbox, killed: dict[str, KeeperJob], name: str
) -> None:
    job = killed[name]
    logs = keeper_shape_sandbox.logs(job.job_id)
    assert job.killed_at, f"job {job.job_id} never reached step {KILL_AT}\n{logs}"
    assert job.again is not None, f"{name}: no training after the keeper's death\n{logs}"
    assert keeper_shape_sandbox.wait(job.job_id, 900) == "COMPLETED", logs
    found = KEEPER.search(job.text())
    assert found, job.text()[-3000:]
    assert int(found.group(1)) == job.keeper
    events = read_events(job.out)
    assert named(events, "done")[-1]["step"] == STEPS
    starts = named(events, "cluster")
    assert int(starts[-1]["restart_count"]) >= 1, starts  # requeued
    resumed = named(events, "resumed")[-1]
    reached = max(e["step"] for e in named(events, "progress")
                  if e.get("time", 0) <= resumed.get("time", 0))  # fmt: skip
    redone = max(reached - int(resumed["step"]), 0)
    print(f"MEASURED keeper {name}: killed at step {job.at_step} -> training again "
          f"{job.again:.1f} s, resumed at step {resumed['step']} from {resumed['source']} "
          f"({redone} step(s) redone)")  # fmt: skip
    assert "memory" in str(resumed["source"]), resumed
    assert redone <= 1, (reached, resumed)
    states = keeper_shape_sandbox.sandbox.node_states()
    assert not [n for n, s in states.items() if "drain" in s or "down" in s], states
    assert no_process_left(job.job_id) == [], job.text()[-3000:]
