"""End-to-end: jobs/mnist.sbatch and jobs/resnet.sbatch trained across sandbox nodes.

The three jobs are submitted together (they fit side by side on the 3-node sandbox)
and each test then checks one of them from its outputs: every rank's JSON event lines
(``cluster``, ``eval``, ``done``), the job log and the model directory.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import SlurmSandbox
from tests.e2e.jobruns import SandboxJob, check_training, submit_job
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
) -> Iterator[dict[str, SandboxJob]]:
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
        run.cancel()


def test_mnist_two_nodes(training_jobs: dict[str, SandboxJob]) -> None:
    check_training(training_jobs["mnist2"])


def test_mnist_one_node_fallback(training_jobs: dict[str, SandboxJob]) -> None:
    run = training_jobs["mnist1"]
    check_training(run)
    assert run.of("cluster")[0][0]["num_workers"] == 1


def test_resnet_two_nodes(training_jobs: dict[str, SandboxJob]) -> None:
    check_training(training_jobs["resnet2"])
