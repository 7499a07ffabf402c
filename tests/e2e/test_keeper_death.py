"""The keeper, the batch script's own process, is SIGKILLed during a step: the job is
requeued at once by its supervisor (the parent-death signal), trains again from the step
the survivors held (their memory: at most one step redone) and ends COMPLETED with one
weights checksum.

A 2-node ``sbatch jobs/mnist.sbatch`` run on a 2-node sandbox; the keeper is killed at
step 12. Prints a ``MEASURED`` line: the kill to training again. The user-shaped runs
(several minutes, a keeper killed between steps and during the supervisor's own restart)
are the long tier's (tests/e2e/test_user_shape_keeper.py).
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import SlurmSandbox, module_sandbox, tracked_jobs
from tests.e2e.jobruns import (
    SandboxJob,
    batch_side,
    first_count,
    no_process_left,
    trained_in_start,
    wait_until,
)

pytestmark = [pytest.mark.slurm, pytest.mark.tf]

STEPS = 120  # enough that the steps left outlast the old step's end (KillWait)
ARGS = ["--batch_size=16", "--eval_steps=1", "--num_threads=1", "--seed=7", "--log_every=1",
        f"--train_steps={STEPS}", "--checkpoint_every=50", "--heartbeat_timeout=10"]  # fmt: skip
SAID = re.compile(
    r"the keeper \(pid (\d+) on node\d\), the job's own process, was killed by SIGKILL at "
    r"\S+: requeueing job \d+ \(restart 1, " + first_count("2") + r", MAX_RESTARTS\)"
)


@pytest.fixture(scope="module")
def keeper_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    yield from module_sandbox(tmp_path_factory, "keeper", nodes=2, gpus_per_node=0)


@pytest.fixture
def jobs(keeper_sandbox: SlurmSandbox) -> Iterator[list[SandboxJob]]:
    yield from tracked_jobs()


@pytest.mark.matrix
def test_a_killed_keeper_requeues_the_job_which_resumes_from_its_checkpoint(
    keeper_sandbox: SlurmSandbox, jobs: list[SandboxJob], tmp_path: Path
) -> None:
    job = SandboxJob(keeper_sandbox, tmp_path / "mnist")
    jobs.append(job)
    job.submit(ARGS, sbatch_args=["--gres=none"],
               env={"MAX_RESTARTS": "2", "SLURMTF_HEARTBEAT_S": "2"})  # fmt: skip
    wait_until(job, lambda: job.progress() >= 12, 300, "step 12")
    keeper = batch_side(job.log_dir, job.job_id).keeper
    os.kill(keeper, signal.SIGKILL)
    killed = time.monotonic()
    wait_until(job, lambda: trained_in_start(job.log_dir / "rank0.out", 2), 150,
               "training after the keeper's death")  # fmt: skip
    print(f"MEASURED keeper SIGKILL -> training again {time.monotonic() - killed:.1f} s")
    assert job.wait(180) == "COMPLETED", job.report()

    found = SAID.search(job.job_output())
    assert found, job.job_output()
    assert found.group(1) == str(keeper)
    show = keeper_sandbox.run(["scontrol", "show", "job", job.job_id]).stdout
    assert "Restarts=1 " in show, show
    clusters = job.events(0, "cluster")
    assert [c["restart_count"] for c in clusters] == [0, 1], clusters
    finals = [job.events(rank, "done")[-1] for rank in (0, 1)]
    assert [f["step"] for f in finals] == [STEPS, STEPS], job.report()
    resumed = job.events(0, "resumed")[-1]
    reached = max(e["step"] for e in job.events(0, "progress") if e["time"] <= resumed["time"])
    assert "memory" in resumed["source"], resumed  # the survivors saved the step they held
    assert reached - resumed["step"] <= 1, (reached, resumed)
    assert all(f["start_step"] == resumed["step"] for f in finals), finals
    assert len({f["weights_checksum"] for f in finals}) == 1, finals
    assert no_process_left(job.job_id) == [], job.report()
