"""End-to-end: jobs/mnist.sbatch and jobs/resnet.sbatch trained across sandbox nodes.

The three jobs are submitted together (they fit side by side on the 3-node sandbox)
and each test then checks one of them from its outputs: every rank's JSON event lines
(``cluster``, ``eval``, ``done``), the job log and the model directory. The 2-node MNIST
job trains on tiny MNIST files staged to each node's scratch (``STAGE_DATA=1``); another
stages the real-digit sample given as the model's ``--data_dir=DIR``.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmtf.cli import data as data_cli
from tests.e2e.conftest import SlurmSandbox
from tests.e2e.jobruns import SandboxJob, check_training, submit_job
from tests.helpers.datafiles import have_sklearn, with_manifest, write_mnist
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
    data = with_manifest(write_mnist(root / "shared" / "mnist"))
    staged = {"DATA_DIR": str(data), "STAGE_DATA": "1"}
    runs = {
        "mnist2": submit_job(
            slurm_sandbox, root, "mnist2", script="mnist.sbatch", nodes=2, args=TINY, env=staged
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


@pytest.mark.matrix
def test_mnist_two_nodes(training_jobs: dict[str, SandboxJob]) -> None:
    check_training(training_jobs["mnist2"])


def staged_events(run: SandboxJob) -> list[dict[str, object]]:
    lines = run.job_output().splitlines()
    return [json.loads(line) for line in lines if line.startswith('{"event": "staged"')]


def test_staged_data_one_verified_copy_per_node_read_and_removed(
    training_jobs: dict[str, SandboxJob], slurm_sandbox: SlurmSandbox
) -> None:
    run = training_jobs["mnist2"]
    assert run.finish() == "COMPLETED", run.report()
    staged = staged_events(run)
    scratch = slurm_sandbox.dir / "scratch"
    nodes = [c[0]["workers"][c[0]["rank"]].rsplit(":", 1)[0] for c in run.of("cluster").values()]
    assert sorted(e["node"] for e in staged) == sorted(set(nodes)), run.report()  # one per node
    assert len(staged) == 2, run.report()
    for event in staged:
        assert event["path"] == str(scratch / f"{event['node']}/slurmtf-data-{run.job_id}/mnist")
        assert event["reused"] is False
    # every rank read its own node's copy, and said so
    read = {c[0]["data_dir"] for c in run.of("cluster").values()}
    assert read == {e["path"] for e in staged}, run.report()
    assert "not training" not in run.job_output()
    # nothing left on any node afterwards
    assert not list(scratch.glob(f"*/slurmtf-data-{run.job_id}*")), run.report()


def test_a_corrupted_data_set_stops_the_job_before_training(
    slurm_sandbox: SlurmSandbox, tmp_path: Path
) -> None:
    data = with_manifest(write_mnist(tmp_path / "mnist", n_train=8, n_eval=8))
    victim = data / "train-images-idx3-ubyte.gz"
    victim.write_bytes(victim.read_bytes()[:-1] + b"!")
    env = {"DATA_DIR": str(data), "STAGE_DATA": "1"}
    run = submit_job(
        slurm_sandbox, tmp_path, "bad", script="mnist.sbatch", nodes=2, args=TINY, env=env
    )
    assert run.wait(120) == "FAILED", run.report()
    (line,) = [ln for ln in run.job_output().splitlines() if "not training" in ln]
    assert str(victim) in line, line
    assert "does not match" in line, line
    assert "HINT: " in line, line
    assert not list(run.log_dir.glob("rank*.out")), "a rank started training"
    assert not list((slurm_sandbox.dir / "scratch").glob(f"*/slurmtf-data-{run.job_id}*"))


@pytest.mark.matrix
def test_mnist_one_node_fallback(training_jobs: dict[str, SandboxJob]) -> None:
    run = training_jobs["mnist1"]
    check_training(run)
    assert run.of("cluster")[0][0]["num_workers"] == 1


@pytest.mark.matrix
def test_resnet_two_nodes(training_jobs: dict[str, SandboxJob]) -> None:
    check_training(training_jobs["resnet2"])


def test_the_data_set_given_as_the_model_flag_is_staged(
    slurm_sandbox: SlurmSandbox, tmp_path: Path
) -> None:
    """``STAGE_DATA=1 sbatch --gres=none jobs/mnist.sbatch --data_dir=DIR --train_steps=20``
    with DIR from ``slurmtf data sample-mnist DIR``: no DATA_DIR, the flag alone."""
    require(importlib.util.find_spec("tensorflow") is not None, "TensorFlow (pip install .[cpu])")
    require(have_sklearn(), "scikit-learn (pip install 'slurmtf[data]')")
    data = tmp_path / "digits"
    assert data_cli.main(["sample-mnist", str(data)]) == 0
    run = submit_job(
        slurm_sandbox, tmp_path, "flag", script="mnist.sbatch", nodes=2,
        args=[f"--data_dir={data}", "--train_steps=20", "--eval_steps=1", "--num_threads=1"],
        sbatch_args=["--gres=none"], env={"STAGE_DATA": "1"},
    )  # fmt: skip
    assert run.finish() == "COMPLETED", run.report()
    staged = staged_events(run)
    assert len({e["node"] for e in staged}) == 2, run.report()  # one copy per node
    assert all(e["path"].endswith(f"slurmtf-data-{run.job_id}/digits") for e in staged), staged
    read = {c[0]["data_dir"] for c in run.of("cluster").values()}
    assert read == {e["path"] for e in staged}, run.report()  # each rank its node's copy
    assert not list((slurm_sandbox.dir / "scratch").glob(f"*/slurmtf-data-{run.job_id}*"))
