"""A ``--nodes=2-3`` job loses a node and goes on, on the nodes left; never on a drained node.

``MIN_NODES=2 sbatch --nodes=2-3 jobs/mnist.sbatch`` on the shared three-node sandbox
starts on all three nodes (the job scripts ask no task count, so Slurm gives the range's
maximum). Mid-run the node of rank 2 is drained and rank 2 is killed: the job restarts
in place (no requeue) on the two nodes left, leaving the drained node out; the model
restores the checkpoint onto two workers with the same global batch, and the job ends
COMPLETED. The ``cluster`` event and ``slurmtf status`` say the worker count changed.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmtf.events import read_events
from slurmtf.slurm.release import SlurmRelease
from tests.e2e.conftest import PYTHON, REPO, SlurmSandbox
from tests.e2e.jobruns import SandboxJob, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.tf, pytest.mark.slow]

# ``scontrol show job`` prints SubmitLine= (the job's --nodes range) from Slurm 25.11.
SUBMIT_LINE_FROM = SlurmRelease(25, 11)
STEPS = 30
BATCH = 12  # splits over 3 and over 2 workers
ARGS = [
    f"--batch_size={BATCH}", "--eval_steps=1", "--num_threads=1", "--seed=3", "--log_every=1",
    f"--train_steps={STEPS}", "--checkpoint_every=10", "--heartbeat_timeout=30",
]  # fmt: skip


@pytest.fixture
def drained(slurm_sandbox: SlurmSandbox) -> Iterator[list[str]]:
    """Nodes the test drains; back in service afterwards."""
    nodes: list[str] = []
    yield nodes
    for node in nodes:
        slurm_sandbox.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)


def all_idle(sandbox: SlurmSandbox, timeout: float = 120) -> None:
    """Wait until no job holds a node: a range job takes what is free when it starts."""
    deadline = time.monotonic() + timeout
    while (states := sandbox.sandbox.node_states()) and time.monotonic() < deadline:
        if all(state == "idle" for state in states.values()):
            return
        time.sleep(1)
    pytest.fail(f"nodes not idle within {timeout:.0f} s: {states}")


def drain_and_kill_rank_2(
    sandbox: SlurmSandbox, jobs: list[SandboxJob], drained: list[str], run_dir: Path,
    env: dict[str, str],
) -> tuple[SandboxJob, str]:  # fmt: skip
    """A ``--nodes=2-3`` MNIST job on all three nodes; at step 12 rank 2's node is drained
    and rank 2 killed; the job has ended COMPLETED. The job and the drained node."""
    all_idle(sandbox)
    job = SandboxJob(sandbox, run_dir, nodes=3, tasks=3)
    jobs.append(job)
    job.submit(ARGS, node_range="2-3", env={"MAX_RESTARTS": "2", **env})
    wait_until(job, lambda: job.progress() >= 12, 300, "step 12 on three nodes")
    first = job.events(0, "cluster")
    assert [c["num_workers"] for c in first] == [3], job.report()
    node = job.rank_node(2)
    sandbox.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=node-range-test"])
    drained.append(node)
    job.signal_rank(2, signal.SIGKILL)
    lost = time.monotonic()
    assert job.wait(400) == "COMPLETED", job.report()
    print(f"MEASURED range restart to COMPLETED {time.monotonic() - lost:.1f} s")
    return job, node


def check_two_workers_with_the_same_batch(job: SandboxJob, node: str) -> None:
    """Trained on 3 workers, then on the 2 nodes left (never the drained one) from the last
    checkpoint with the same global batch, to the last step with one checksum."""
    clusters = job.events(0, "cluster")
    assert [c["num_workers"] for c in clusters] == [3, 2], clusters
    assert [c["restart_count"] for c in clusters] == [0, 1], clusters
    assert [c["global_batch"] for c in clusters] == [BATCH, BATCH], clusters
    assert [c["per_replica_batch"] for c in clusters] == [BATCH // 3, BATCH // 2], clusters
    hosts = {w.rsplit(":", 1)[0] for w in clusters[-1]["workers"]}
    assert node not in hosts, f"restarted on the drained {node}: {hosts}"
    finals = [job.events(rank, "done")[-1] for rank in (0, 1)]
    assert [f["step"] for f in finals] == [STEPS, STEPS], job.report()
    assert finals[0]["weights_checksum"] == finals[1]["weights_checksum"], finals


@pytest.mark.matrix
def test_a_range_job_without_min_nodes_never_trains_on_the_drained_node(
    slurm_sandbox: SlurmSandbox, jobs: list[SandboxJob], drained: list[str], tmp_path: Path
) -> None:
    """Without MIN_NODES: Slurm 25.11 and later tell the range (SubmitLine=), so the job
    goes on in place on the 2 nodes left; 22.05 to 25.05 do not, so the job is requeued
    without the drained node and starts again on the 2 nodes left."""
    job, node = drain_and_kill_rank_2(slurm_sandbox, jobs, drained, tmp_path / "range", {})
    check_two_workers_with_the_same_batch(job, node)
    show = slurm_sandbox.run(["scontrol", "show", "job", job.job_id]).stdout
    output = job.job_output()
    if slurm_sandbox.sandbox.config().release >= SUBMIT_LINE_FROM:
        assert "Restarts=0 " in show, show
        assert f"{node} left out, training on the 2 node(s) left (minimum 2)" in output, output
    else:
        assert "Restarts=1 " in show, show
        assert f"ExcNodeList={node}" in show.split(), show
        assert f"the restarted job avoids node(s) {node}" in output, output


@pytest.mark.matrix
def test_a_range_job_goes_on_on_the_nodes_left(
    slurm_sandbox: SlurmSandbox,
    jobs: list[SandboxJob],
    drained: list[str],
    tmp_path: Path,
) -> None:
    state_home = tmp_path / "state"
    # MIN_NODES names the range's minimum on every release (Slurm 22.05 does not tell it)
    env = {"MIN_NODES": "2", "XDG_STATE_HOME": str(state_home)}
    job, node = drain_and_kill_rank_2(slurm_sandbox, jobs, drained, tmp_path / "range", env)
    check_two_workers_with_the_same_batch(job, node)
    clusters = job.events(0, "cluster")
    assert [c.get("workers_changed_from") for c in clusters] == [None, 3], clusters
    output = job.job_output()
    assert f"{node} left out, training on the 2 node(s) left (minimum 2)" in output, output
    show = slurm_sandbox.run(["scontrol", "show", "job", job.job_id]).stdout
    assert "Restarts=0 " in show, show  # in place: never back through the queue
    chief = read_events(job.log_dir / "rank0.out")
    second = [i for i, e in enumerate(chief) if e["event"] == "cluster"][1]
    resumed = next(e["step"] for e in chief[second:] if e["event"] == "progress")
    assert resumed > 10, f"did not resume from a checkpoint: first step {resumed}"

    env = {"XDG_STATE_HOME": str(state_home), "PYTHONPATH": str(REPO)}
    status = slurm_sandbox.run(
        [PYTHON, "-m", "slurmtf.cli", "status", job.job_id], cwd=state_home, env=env
    )
    assert "2 workers (was 3 before restart 1)" in status.stdout, status.stdout

    # A fixed count the nodes left cannot give waits; status says why, naming the node.
    sbatch = ["sbatch", "--parsable", "-N3", f"--output={tmp_path}/%j.out", "--wrap=true"]
    waiting = slurm_sandbox.run(sbatch).stdout.strip().split(";")[0]
    try:
        line = wait_for_line(slurm_sandbox, waiting, "pending: waits for nodes", env, tmp_path)
    finally:
        slurm_sandbox.run(["scancel", waiting], check=False)
    assert f"unavailable: {node} drain (node-range-test)" in line, line
    assert "it asks 3 node(s)" in line, line


def wait_for_line(
    sandbox: SlurmSandbox, job_id: str, words: str, env: dict[str, str], folder: Path
) -> str:
    """``slurmtf status JOB``'s line with ``words``, once the scheduler has looked at it."""
    deadline = time.monotonic() + 60
    status = ""
    while time.monotonic() < deadline:
        status = sandbox.run(
            [PYTHON, "-m", "slurmtf.cli", "status", job_id, f"--log_dir={folder}"], env=env
        ).stdout
        found = [line for line in status.splitlines() if words in line]
        if found:
            return found[0]
        time.sleep(1)
    raise AssertionError(f"no {words!r} in slurmtf status {job_id}:\n{status}")


def test_submit_a_range_gets_every_free_node(slurm_sandbox: SlurmSandbox, tmp_path: Path) -> None:
    """``slurmtf submit --nodes=2-3 --gpus_per_node=2`` on three idle nodes: 3 nodes x 2
    tasks (Slurm would give 2 had the job asked a task count)."""
    all_idle(slurm_sandbox)
    say = "echo node=$SLURMD_NODENAME rank=$SLURM_PROCID of $SLURM_STEP_NUM_TASKS"
    done = slurm_sandbox.run(
        [PYTHON, "-m", "slurmtf.cli", "submit", f"--command=bash -c '{say}'", "--nodes=2-3",
         "--gpus_per_node=2", "--time=5", f"--log_dir={tmp_path}", "--wait"],
        cwd=tmp_path, env={"PYTHONPATH": str(REPO)}, timeout=300,
    )  # fmt: skip
    assert "2-3 node(s) x 2 task(s)" in done.stdout, done.stdout
    said = sorted(
        line
        for path in tmp_path.glob("*_log.out")
        for line in path.read_text().splitlines()
        if line.startswith("node=")
    )
    assert said == [f"node=node{1 + r // 2} rank={r} of 6" for r in range(6)], done.stdout
