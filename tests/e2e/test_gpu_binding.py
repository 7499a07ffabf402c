"""End-to-end: one GPU share per worker, for every way of asking Slurm for GPUs.

A 4-node sandbox with 4 fake GPUs per node (gres ``File=`` links to /dev/null); every
job takes 2 nodes, so the training job runs beside the others. Every rank's
``CUDA_VISIBLE_DEVICES`` is what the model's entry point ends with: the cheap jobs run
the model with ``--placement_only`` (the same resolve-and-apply path, then a
``placement`` event instead of TensorFlow); one job trains for real and checks the
``cluster`` event. CPU TensorFlow sees no GPU, so the replica count checked is the one
slurmtf planned (``planned_replicas``); ``local_replicas`` is TensorFlow's own (1 here).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurmtf.cluster.ports import free_port_base
from slurmtf.sandbox import Sandbox
from tests.e2e.conftest import REPO, SlurmSandbox, require_sandbox_prereqs
from tests.e2e.jobruns import SandboxJob
from tests.prereqs import require

pytestmark = pytest.mark.slurm

PY = sys.executable
NODES, GPUS = 2, 4  # per job; the sandbox has twice the nodes
IN_ORDER = ["0", "1", "2", "3"] * NODES
REVERSED = ["3", "2", "1", "0"] * NODES
# (id, sbatch options of jobs/mnist.sbatch, tasks per node, each rank's GPUs)
SBATCH_FORMS = [
    ("gres", ["--gres=gpu:4"], 4, IN_ORDER),
    ("gpus-per-node", ["--gres=none", "--gpus-per-node=4"], 4, IN_ORDER),
    ("gpus-per-task", ["--gres=none", "--gpus-per-task=1"], 4, IN_ORDER),
    ("gpu-bind", ["--gres=gpu:4", "--gpu-bind=map_gpu:3,2,1,0"], 4, REVERSED),
    ("one-task-per-node", ["--gres=gpu:4"], 1, ["0,1,2,3"] * NODES),
]
# (id, python -m slurmtf.submit options, tasks per node, each rank's GPUs)
SUBMIT_FORMS = [
    ("gres", ["--gpus_per_node=4"], 4, IN_ORDER),
    ("gpus-per-node", ["--gpus_per_node=4", "--gpu_flag=gpus-per-node"], 4, IN_ORDER),
    ("gpus-per-task", ["--gpus_per_node=4", "--gpu_flag=gpus-per-task"], 4, IN_ORDER),
    ("gpu-bind", ["--gpus_per_node=4", "--sbatch_extra=gpu-bind=map_gpu:3,2,1,0"], 4, REVERSED),
    ("one-task-per-node", ["--gpus_per_node=4", "--gpus_per_task=4"], 1, ["0,1,2,3"] * NODES),
]
TRAIN = ["--train_steps=2", "--batch_size=16", "--eval_steps=1", "--log_every=1",
         "--num_threads=1"]  # fmt: skip


@pytest.fixture(scope="module")
def gpu_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    """4 nodes x 4 fake GPUs, for this module only."""
    require_sandbox_prereqs()
    sandbox = Sandbox(tmp_path_factory.mktemp("gpus"), nodes=2 * NODES, gpus_per_node=GPUS)
    sandbox.up()
    try:
        yield SlurmSandbox(sandbox)
    finally:
        sandbox.down()


def _events(path: Path, name: str) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(x) for x in lines if x.startswith(f'{{"event": "{name}"')]


def _check(seen: dict[int, dict[str, Any]], tasks: int, gpus: list[str], report: str) -> None:
    """Every rank reported; its GPUs are the expected ones, no GPU twice on a node."""
    ranks = list(range(NODES * tasks))
    assert sorted(seen) == ranks, report
    assert [seen[r]["cuda_visible_devices"] for r in ranks] == gpus, report
    assert [seen[r]["planned_replicas"] for r in ranks] == [GPUS // tasks] * len(ranks), report
    for node in range(NODES):
        on_node = [
            seen[r]["cuda_visible_devices"] for r in ranks[node * tasks : (node + 1) * tasks]
        ]
        held = [gpu for share in on_node for gpu in share.split(",")]
        assert len(set(held)) == len(held), f"two workers of a node share a GPU\n{report}"


def _sbatch(
    sbx: SlurmSandbox, run_dir: Path, tasks: int, options: list[str], args: list[str]
) -> SandboxJob:
    """``sbatch jobs/mnist.sbatch`` on 2 nodes; ports of its own (jobs run side by side,
    and other sandboxes on this machine number their jobs alike)."""
    job = SandboxJob(sbx, run_dir, nodes=NODES, timeout=400)
    port_base = str(free_port_base(NODES * tasks))
    job.submit(
        args, tasks_per_node=tasks, sbatch_args=options, env={"SLURMTF_PORT_BASE": port_base}
    )
    return job


@pytest.fixture(scope="module")
def train_run(
    gpu_sandbox: SlurmSandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandboxJob]:
    """A real 2-node MNIST job, 2 tasks per node with 2 GPUs each; submitted first."""
    require(importlib.util.find_spec("tensorflow") is not None, "TensorFlow (pip install .[cpu])")
    root = tmp_path_factory.mktemp("train")
    run = _sbatch(gpu_sandbox, root / "train", 2, ["--gres=gpu:4"], TRAIN)
    yield run
    run.cancel()


@pytest.fixture(scope="module")
def sbatch_runs(
    gpu_sandbox: SlurmSandbox, tmp_path_factory: pytest.TempPathFactory, train_run: SandboxJob
) -> dict[str, SandboxJob]:
    """Every sbatch form, submitted at once (they queue for two nodes), after training."""
    root = tmp_path_factory.mktemp("sbatch_forms")
    return {
        name: _sbatch(gpu_sandbox, root / name, tasks, options, ["--placement_only"])
        for name, options, tasks, _ in SBATCH_FORMS
    }


@pytest.mark.matrix
@pytest.mark.parametrize(("name", "tasks", "gpus"), [(f[0], f[2], f[3]) for f in SBATCH_FORMS])
def test_sbatch_job_script_forms(
    sbatch_runs: dict[str, SandboxJob], name: str, tasks: int, gpus: list[str]
) -> None:
    run = sbatch_runs[name]
    assert run.finish() == "COMPLETED", run.report()
    seen = {rank: evs[0] for rank, evs in run.of("placement").items() if evs}
    _check(seen, tasks, gpus, run.report())


@pytest.fixture(scope="module")
def submit_runs(
    gpu_sandbox: SlurmSandbox, tmp_path_factory: pytest.TempPathFactory, train_run: SandboxJob
) -> dict[str, tuple[str, Path]]:
    """Every submit form, submitted at once: name -> (job id, log folder)."""
    runs = {}
    for name, options, _, _ in SUBMIT_FORMS:
        logs = tmp_path_factory.mktemp(f"submit_{name}")
        done = gpu_sandbox.run(
            [PY, "-m", "slurmtf.submit", "--model=mnist", f"--nodes={NODES}", "--time=5",
             f"--log_dir={logs}", *options, "--", "--placement_only"],
            timeout=120, env={"SLURMTF_PORT_BASE": str(free_port_base(NODES * GPUS))},
        )  # fmt: skip
        match = re.search(r"submitted job (\d+)", done.stdout)
        assert match, done.stdout + done.stderr
        runs[name] = (match.group(1), logs)
    return runs


@pytest.mark.matrix
@pytest.mark.parametrize(("name", "tasks", "gpus"), [(f[0], f[2], f[3]) for f in SUBMIT_FORMS])
def test_submit_forms(
    gpu_sandbox: SlurmSandbox,
    submit_runs: dict[str, tuple[str, Path]],
    name: str,
    tasks: int,
    gpus: list[str],
) -> None:
    job, logs = submit_runs[name]
    state = gpu_sandbox.wait(job, timeout=180)
    report = f"{gpu_sandbox.logs(job)}\n" + "\n".join(
        f"--- {p}:\n{p.read_text()[-2000:]}" for p in sorted(logs.glob(f"{job}_*_log.*"))
    )
    assert state == "COMPLETED", report
    seen = {}
    for rank in range(NODES * tasks):
        placed = _events(logs / f"{job}_{rank}_log.out", "placement")
        if placed:
            seen[rank] = placed[0]
    _check(seen, tasks, gpus, report)


@pytest.mark.matrix
def test_srun_without_a_binding_is_split_by_the_entry_point(gpu_sandbox: SlurmSandbox) -> None:
    """Plain srun --gres: Slurm shows every task all 4 GPUs; the model narrows them."""
    done = gpu_sandbox.run(
        ["srun", f"-N{NODES}", "--ntasks-per-node=4", "--gres=gpu:4", "bash", "-c",
         'echo "$CUDA_VISIBLE_DEVICES" >&2; exec "$0" -m models.mnist --placement_only', PY],
        timeout=120, env={"PYTHONPATH": str(REPO), "SLURMTF_PORT_BASE": str(free_port_base(8))},
    )  # fmt: skip
    assert set(done.stderr.split()) == {"0,1,2,3"}, done.stderr  # what Slurm gave each task
    placed = [json.loads(x) for x in done.stdout.splitlines() if '"placement"' in x]
    _check({e["rank"]: e for e in placed}, 4, IN_ORDER, done.stdout + done.stderr)


@pytest.mark.tf
def test_training_reports_each_ranks_gpus_in_the_cluster_event(train_run: SandboxJob) -> None:
    """--gres=gpu:4 with 2 tasks per node: 2 GPUs per worker, bound by the job script."""
    assert train_run.finish() == "COMPLETED", train_run.report()
    seen = {rank: evs[0] for rank, evs in train_run.of("cluster").items() if evs}
    _check(seen, 2, ["0,1", "2,3"] * NODES, train_run.report())
    for event in seen.values():
        assert event["num_workers"] == NODES * 2
        assert (event["gpus"], event["local_replicas"]) == (0, 1)  # CPU TensorFlow
    assert all(train_run.of("done")[r] for r in seen), train_run.report()
