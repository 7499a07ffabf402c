"""Width: a 16-node sandbox and an 8-worker ResNet-20.

Users train on dozens of nodes; most other end-to-end tests use two. The job runs the
bundled ResNet with its default flags (only the step count is small) as 4 nodes x 2
tasks, and checks what every healthy job shows: one cluster of the right size, each rank
on the node Slurm placed it on, a falling loss and the same weights on every rank. The
8-worker MNIST job is the documented ``submit --model=mnist --nodes=2 --gpus_per_node=4``
(2 nodes x 4 tasks, the default batch fitted to 8 replicas), the 16-worker one the
documented ``sbatch -N4 --gres=gpu:4 --ntasks-per-node=4 jobs/mnist.sbatch
--batch_size=800``: both run by tests/e2e/test_documented_commands.py. The sandbox
start-up time of 16 nodes is printed as ``MEASURED sandbox_up_16 <s>``, the job's as
``MEASURED <name> <s>``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmtf.sandbox import Sandbox
from tests.e2e.conftest import SlurmSandbox, require_sandbox_prereqs
from tests.e2e.jobruns import SandboxJob, check_training, submit_job

pytestmark = [pytest.mark.slurm, pytest.mark.tf, pytest.mark.slow]

NODES = 16
FEW = ["--eval_steps=2", "--log_every=5"]


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    require_sandbox_prereqs()
    sandbox = Sandbox(tmp_path_factory.mktemp("wide"), nodes=NODES, gpus_per_node=0)
    started = time.monotonic()
    sandbox.up()
    print(f"MEASURED sandbox_up_{NODES} {time.monotonic() - started:.1f}")
    try:
        yield SlurmSandbox(sandbox)
    finally:
        sandbox.down()


def run_job(
    wide: SlurmSandbox, root: Path, name: str, *, per_node: int, args: list[str]
) -> SandboxJob:
    """Submit ``jobs/<model>.sbatch`` on 4 nodes x ``per_node`` tasks and wait for it."""
    started = time.monotonic()
    script = "resnet.sbatch" if name.startswith("resnet") else "mnist.sbatch"
    run = submit_job(
        wide, root, name, script=script, nodes=4, tasks_per_node=per_node,
        args=[*args, *FEW], sbatch_args=["--gres=none"], timeout=900,
    )  # fmt: skip
    run.finish()
    print(f"MEASURED {name} {time.monotonic() - started:.1f}")
    return run


def check_placement(run: SandboxJob, per_node: int) -> None:
    """Block distribution: ranks 0..per_node-1 on the first node, and so on."""
    workers = run.of("cluster")[0][0]["workers"]
    hosts = [w.rsplit(":", 1)[0] for w in workers]
    assert len(hosts) == run.tasks
    for node in range(run.nodes):
        assert len(set(hosts[node * per_node : (node + 1) * per_node])) == 1, hosts
    assert len(set(hosts)) == run.nodes, hosts
    assert len(set(workers)) == run.tasks, f"two ranks share an address: {workers}"


def test_a_16_node_sandbox_comes_up_and_runs_a_step_on_every_node(wide: SlurmSandbox) -> None:
    states = wide.sandbox.node_states()
    assert sorted(states, key=lambda n: int(n.removeprefix("node"))) == [
        f"node{i}" for i in range(1, NODES + 1)
    ]
    done = wide.run(["srun", f"-N{NODES}", "--ntasks-per-node=1", "printenv", "SLURMD_NODENAME"],
                    timeout=120)  # fmt: skip
    assert sorted(done.stdout.split()) == sorted(f"node{i}" for i in range(1, NODES + 1))


def test_eight_workers_train_resnet20(wide: SlurmSandbox, tmp_path: Path) -> None:
    args = ["--resnet_size=20", "--train_steps=8"]
    run = run_job(wide, tmp_path, "resnet8", per_node=2, args=args)
    check_training(run)
    check_placement(run, 2)
