"""End-to-end: jobs/mnist.sbatch and jobs/resnet.sbatch trained across sandbox nodes.

The three jobs are submitted together (they fit side by side on the 3-node sandbox)
and each test then checks one of them from its outputs: every rank's JSON event lines
(``cluster``, ``eval``, ``done``), the job log and the model directory.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import TERMINAL, SlurmSandbox
from tests.e2e.jobruns import JobRun, check_training, submit_job
from tests.prereqs import require

pytestmark = [pytest.mark.slurm, pytest.mark.tf]

JOB_TIMEOUT_S = 400  # three TensorFlow jobs share 2 cores
TINY = [
    "--train_steps=30",
    "--batch_size=32",
    "--eval_steps=2",
    "--log_every=10",
    "--num_threads=1",
]
TINY_RESNET = ["--resnet_size=20", "--train_steps=16", "--batch_size=32", "--eval_steps=1",
               "--log_every=8", "--num_threads=1"]  # fmt: skip


@pytest.fixture(scope="module")
def training_jobs(
    slurm_sandbox: SlurmSandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, JobRun]]:
    require(importlib.util.find_spec("tensorflow") is not None, "TensorFlow (pip install .[cpu])")
    root = tmp_path_factory.mktemp("jobs")
    runs = {
        "mnist2": submit_job(
            slurm_sandbox, root, "mnist2", script="mnist.sbatch", nodes=2, args=TINY
        ),
        "mnist1": submit_job(
            slurm_sandbox, root, "mnist1", script="mnist.sbatch", nodes=1, args=TINY
        ),
        "resnet2": submit_job(
            slurm_sandbox, root, "resnet2", script="resnet.sbatch", nodes=2, args=TINY_RESNET
        ),
    }
    yield runs
    for run in runs.values():
        if not run.state:
            slurm_sandbox.run(["scancel", run.job_id], check=False)


def test_mnist_two_nodes(training_jobs: dict[str, JobRun]) -> None:
    check_training(training_jobs["mnist2"])


def test_mnist_one_node_fallback(training_jobs: dict[str, JobRun]) -> None:
    run = training_jobs["mnist1"]
    check_training(run)
    assert run.of("cluster")[0][0]["num_workers"] == 1


def test_resnet_two_nodes(training_jobs: dict[str, JobRun]) -> None:
    check_training(training_jobs["resnet2"])


def test_preempted_job_requeues_and_resumes(
    slurm_sandbox: SlurmSandbox, training_jobs: dict[str, JobRun], tmp_path: Path
) -> None:
    """USR2 to every rank: the model saves and exits 75, the script requeues, run 2 resumes."""
    for run in training_jobs.values():  # run alone: the others would slow it down
        run.finish()
    steps = ["--train_steps=300", "--batch_size=32", "--eval_steps=2", "--log_every=5"]
    run = submit_job(slurm_sandbox, tmp_path, "preempt", script="mnist.sbatch", nodes=2, args=steps)
    chief_log = run.log_dir / "rank0.err"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        text = chief_log.read_text(errors="replace") if chief_log.exists() else ""
        if " step 5/" in text or slurm_sandbox.state(run.job_id) in TERMINAL:
            break
        time.sleep(0.5)
    else:
        slurm_sandbox.run(["scancel", run.job_id], check=False)
        pytest.fail(f"training never reached step 5\n{run.report()}")
    slurm_sandbox.run(["scancel", "--signal=USR2", run.job_id])
    assert run.finish() == "COMPLETED", run.report()

    done = run.of("done")
    assert [d["restart_count"] for d in done[0]] == [0, 1], run.report()
    first, second = done[0]
    assert first["preempted"] is True
    assert second["preempted"] is False
    assert second["start_step"] == first["step"] > 0, run.report()
    assert second["step"] == 300
    job_log = next(run.run_dir.glob("*.out")).read_text()
    assert "requeueing job" in job_log, job_log
    assert f"job {run.job_id} restart 1" in job_log, job_log
