"""End-to-end: a job whose ranks run in a container, as most HPC sites run TensorFlow.

``CONTAINER="apptainer exec --nv tf.sif"`` with ``jobs/mnist.sbatch`` on 2 nodes, and
``slurmtf submit --container_prefix=...`` with ``--model`` and ``--command``: a stand-in
``apptainer`` (tests/helpers/container.py; Apptainer is not packaged for Debian 12)
records every start and runs the rest as the image would. Every rank starts through it
with the image's own ``python3`` (never the submitting interpreter's path, which an image
does not hold), the job trains and completes; slurmtf's own steps (staging) do not go
through it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from slurmtf.cluster.ports import free_port_base
from tests.e2e.conftest import PYTHON, SlurmSandbox
from tests.e2e.jobruns import check_training, submit_job
from tests.helpers.container import IMAGE_PYTHON, records, write_standin
from tests.helpers.datafiles import with_manifest, write_mnist
from tests.prereqs import require

pytestmark = [pytest.mark.slurm, pytest.mark.tf]

TINY = ["--train_steps=20", "--batch_size=32", "--eval_steps=2", "--log_every=10",
        "--num_threads=1"]  # fmt: skip


def test_every_rank_starts_through_the_container_prefix(
    slurm_sandbox: SlurmSandbox, tmp_path: Path
) -> None:
    require(importlib.util.find_spec("tensorflow") is not None, "TensorFlow (pip install .[cpu])")
    standin = write_standin(tmp_path / "bin")
    record = tmp_path / "container.jsonl"
    data = with_manifest(write_mnist(tmp_path / "shared" / "mnist"))
    env = {"CONTAINER": f"{standin} exec --nv tf.sif", "STANDIN_RECORD": str(record),
           "STAGE_DATA": "1", "DATA_DIR": str(data)}  # fmt: skip
    job = submit_job(slurm_sandbox, tmp_path, "container", script="mnist.sbatch", nodes=2,
                     args=TINY, env=env)  # fmt: skip
    try:
        assert job.finish() == "COMPLETED", job.report()
        check_training(job)
    finally:
        job.cancel()
    starts = records(record)
    lookups = [r for r in starts if "-c" in r["argv"]]  # type: ignore[operator]
    ranks = [r for r in starts if r not in lookups]
    assert len(lookups) == 1, starts  # the batch node's model lookup needs the image too
    assert sorted(str(r["rank"]) for r in ranks) == ["0", "1"], starts
    assert len({r["node"] for r in ranks}) == 2, starts
    for start in [*ranks, *lookups]:
        assert start["interpreter"] == IMAGE_PYTHON, start  # the image's, not PYTHON's path
    for start in ranks:
        argv = start["argv"]
        assert isinstance(argv, list)
        assert argv[:3] == ["exec", "--nv", "tf.sif"], argv
        assert argv[4:6] == ["-m", "models.mnist"], argv
    # slurmtf's own steps (staging, unstaging) ran outside the container
    assert not any("slurmtf.cli" in r["argv"] for r in starts), starts  # type: ignore[operator]


SHOW_PYTHON = "import json, sys; print(json.dumps({'event': 'python', 'path': sys.executable}))"


@pytest.mark.tf_core
@pytest.mark.parametrize(
    "what",
    [["--model=mnist", "--", *TINY], [f"--command=python3 -c {SHOW_PYTHON!r}"]],
    ids=["model", "command"],
)
def test_submit_runs_every_rank_with_the_images_python(
    slurm_sandbox: SlurmSandbox, tmp_path: Path, what: list[str]
) -> None:
    """``submit --container_prefix``: submitit's srun line ran the submitting interpreter
    by its absolute path; behind a prefix every rank now runs the image's ``python3``."""
    standin = write_standin(tmp_path / "bin")
    record = tmp_path / "container.jsonl"
    flags, args = (what[:1], what[1:]) if "--" in what else (what, [])
    done = slurm_sandbox.run(
        [PYTHON, "-m", "slurmtf.submit", *flags, "--nodes=2", "--time=10", "--wait",
         f"--log_dir={tmp_path / 'logs'}", f"--container_prefix={standin} exec --nv tf.sif",
         *args],
        env={"STANDIN_RECORD": str(record), "SLURMTF_PORT_BASE": str(free_port_base(4))},
        timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    starts = records(record)
    assert sorted(str(r["rank"]) for r in starts) == ["0", "1"], starts
    for start in starts:
        assert start["interpreter"] == IMAGE_PYTHON, start
        assert PYTHON not in start["argv"], start  # type: ignore[operator]
