"""A node hangs mid-run: the job goes on inside its allocation, without a requeue.

On the ``recovery_sandbox`` (Slurm's default ``cred_expire`` of 120 s, ``SlurmdTimeout``
120 s, nodes with namespaces of their own) a ``jobs/mnist.sbatch`` run loses a node the
way a real one hangs: its slurmd, step daemons and ranks all get SIGSTOP
(:func:`slurmtf.sandbox.nodefaults.freeze_node`). Another user's exclusive job waits for
the same nodes meanwhile. The job script sees the survivors name the node, finds that it
does not answer (the nodes' beacon has not heard it since the freeze), ends the step
without waiting for Slurm and starts the next one in place, with the ranks the supervisor
started there once the beacon fell silent (TensorFlow imported already):

* ``SPARE_NODES=1`` on 3 nodes: training resumes on the spare at full width (2 workers);
* ``--nodes=2-3`` with ``MIN_NODES=2``: training resumes on the 2 nodes left.

Both within 90 s of the freeze, with Slurm's restart count 0, the competing job still
pending, and the job COMPLETED at the final step with one weights checksum. Both resume
from a survivor's memory (0 steps redone); the spare's job ends with the weights of the
same run undisturbed (2 workers, ``--cluster=local``, run beside it), bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmtf.events import read_events
from slurmtf.sandbox import nodefaults
from slurmtf.sandbox.competitor import Competitor, submit_competitor
from tests.e2e.conftest import SlurmSandbox, tracked_jobs
from tests.e2e.jobruns import SandboxJob, first_count, wait_until
from tests.prereqs import keras_2

pytestmark = [pytest.mark.slurm, pytest.mark.tf, pytest.mark.slow]

STEPS = 50
BATCH = 12  # splits over 3 and over 2 workers
# Keras 2 (TensorFlow 2.15) draws dropout masks from stateful ops no checkpoint holds, so a
# resumed run there trains without dropout to end as the undisturbed run does.
ARGS = [
    f"--batch_size={BATCH}", "--eval_steps=1", "--num_threads=1", "--seed=7", "--log_every=1",
    f"--train_steps={STEPS}", "--checkpoint_every=5", "--heartbeat_timeout=10",
    *(["--dropout_rate=0"] if keras_2() else []),
]  # fmt: skip
RESUME_WITHIN_S = 90


@pytest.fixture
def jobs(recovery_sandbox: SlurmSandbox) -> Iterator[list[SandboxJob]]:
    """Jobs of this module's tests on the recovery sandbox: cancelled at the end."""
    yield from tracked_jobs()


@pytest.fixture
def frozen(recovery_sandbox: SlurmSandbox) -> Iterator[list[int]]:
    """PIDs the test froze; afterwards thawed (job processes killed), every node back."""
    pids: list[int] = []
    yield pids
    if not nodefaults.mend(recovery_sandbox.sandbox, pids, timeout=60):
        pytest.fail(f"nodes not back in service: {recovery_sandbox.sandbox.node_states()}")


@pytest.fixture
def competitors(recovery_sandbox: SlurmSandbox) -> Iterator[list[Competitor]]:
    made: list[Competitor] = []
    yield made
    for competitor in made:
        competitor.cancel()


def resumed_workers(job: SandboxJob) -> list[str] | None:
    """The workers of rank 0's second ``cluster`` event once it has trained a step after
    it (the step in place after the node loss), else None."""
    clusters, workers = 0, None
    for line in job.text("rank0.out").splitlines():
        if '"event": "cluster"' in line:
            clusters += 1
            workers = json.loads(line)["workers"]
        elif clusters >= 2 and '"event": "progress"' in line:
            return list(workers or [])
    return None


def restarts(sandbox: SlurmSandbox, job_id: str) -> str:
    show = sandbox.run(["scontrol", "-o", "show", "job", job_id]).stdout
    return show.split("Restarts=", 1)[1].split()[0]


def lose_a_node(
    sandbox: SlurmSandbox, job: SandboxJob, rank: int, frozen: list[int], rival: Competitor
) -> tuple[str, list[str], float]:
    """Freeze ``rank``'s node mid-run; wait for training in place. (node, workers, s)"""
    wait_until(job, lambda: job.progress() >= 12, 300, "step 12")
    node = job.rank_node(rank)
    assert rival.state() == "PENDING", job.report()
    frozen.extend(nodefaults.freeze_node(sandbox.sandbox, node))
    lost = time.monotonic()
    wait_until(job, lambda: resumed_workers(job) is not None, 240, "training in place")
    seconds = time.monotonic() - lost
    print(f"MEASURED {node} frozen -> training in place {seconds:.1f} s")
    return node, resumed_workers(job) or [], seconds


def check_completed_in_place(
    sandbox: SlurmSandbox, job: SandboxJob, rival: Competitor, ranks: int, frozen: list[int]
) -> None:
    """The job trains to its end in its allocation (the rival pends until the batch script
    is done); then the node comes back (thawed), which lets Slurm finish the job at once
    rather than at SlurmdTimeout, and the job is COMPLETED."""
    assert restarts(sandbox, job.job_id) == "0", job.report()
    wait_until(job, lambda: job.state() != "RUNNING" or rival.state() != "PENDING", 300, "end")
    assert job.state() != "RUNNING", f"the competing job got our nodes\n{job.report()}"
    assert "srun exited 0" in job.job_output(), job.report()
    nodefaults.thaw_node(frozen)
    assert job.wait(200) == "COMPLETED", job.report()
    assert restarts(sandbox, job.job_id) == "0", job.report()
    finals = [job.events(rank, "done")[-1] for rank in range(ranks)]
    assert [f["step"] for f in finals] == [STEPS] * ranks, job.report()
    assert len({f["weights_checksum"] for f in finals}) == 1, finals
    output = job.job_output()
    assert re.search(r"restart 1 in place \(" + first_count("2"), output), output
    assert "requeueing" not in output, output
    # the frozen node was known lost from the nodes' beacon, without waiting on a probe,
    # and the next attempt's ranks were warm on the nodes it took, before it was lost
    assert re.search(r"stopped answering \(node\d silent for [\d.]+ s: the nodes' beacon\)",
                     output), output  # fmt: skip
    assert "silent to the nodes' beacon: warm ranks start on" in output, output
    assert "warm ranks take over" in output, output


@dataclasses.dataclass
class Calm:
    """The same run undisturbed, beside a test's job, and the test's folder."""

    process: subprocess.Popen[str]
    folder: Path

    def checksum(self) -> float:
        out, _ = self.process.communicate(timeout=600)
        assert self.process.returncode == 0, out
        done = [e for p in sorted((self.folder / "calm").glob("*_log.out"))
                for e in read_events(p) if e.get("event") == "done"]  # fmt: skip
        assert len({d["weights_checksum"] for d in done}) == 1, done
        return float(done[0]["weights_checksum"])


@pytest.fixture
def undisturbed(tmp_path: Path) -> Iterator[Calm]:
    """The same 2-worker run (seed, data, batch, steps) with nothing lost, on local
    processes, running beside the sandbox's job; ended if the test ends first."""
    argv = [sys.executable, "-m", "slurmtf.cli", "submit", "--cluster=local", "--nodes=2",
            "--model=mnist", f"--log_dir={tmp_path / 'calm'}", "--",
            f"--model_dir={tmp_path / 'calm-model'}", *ARGS]  # fmt: skip
    env = {**os.environ, "SLURMTF_WARM_STANDBY": "0"}
    calm = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip
    try:
        yield Calm(calm, tmp_path)
    finally:
        if calm.poll() is None:
            os.killpg(calm.pid, signal.SIGKILL)
        calm.communicate()


def check_resumed_from_memory(job: SandboxJob, lost: int) -> None:
    """A survivor (not rank ``lost``) saved the step it held at the freeze; the step in
    place resumed there, and the job's restart line says so (0 steps redone)."""
    rescued = [e for r in range(3) for e in job.events(r, "rescued")]
    assert rescued, f"no rank saved from memory\n{job.report()}"
    assert lost not in {e["rank"] for e in rescued}, rescued
    step = max(e["step"] for e in rescued)
    resumed = job.events(0, "resumed")[-1]
    assert resumed["step"] == step, (resumed, rescued)
    assert "memory" in resumed["source"], resumed
    said = rf"resumes at step {step} from rank \d+'s memory \(0 steps redone\)"
    assert re.search(said, job.job_output()), job.job_output()
    print(f"MEASURED frozen node: resumed at step {step} from {resumed['source']}")


@pytest.mark.matrix
def test_a_frozen_node_is_replaced_by_the_spare_without_a_requeue(
    recovery_sandbox: SlurmSandbox,
    jobs: list[SandboxJob],
    frozen: list[int],
    competitors: list[Competitor],
    undisturbed: Calm,
) -> None:
    job = SandboxJob(recovery_sandbox, undisturbed.folder / "spare", nodes=3)
    jobs.append(job)
    job.submit(ARGS, env={"SPARE_NODES": "1", "MAX_RESTARTS": "2"})
    wait_until(job, lambda: job.progress() >= 1, 300, "training")
    competitors.append(submit_competitor(recovery_sandbox.sandbox, nodes=2))
    node, workers, seconds = lose_a_node(recovery_sandbox, job, 1, frozen, competitors[0])
    assert seconds < RESUME_WITHIN_S, job.report()
    assert len(workers) == 2, workers
    assert not any(w.startswith(f"{node}:") for w in workers), workers
    assert "training on a spare (" in job.job_output(), job.job_output()
    check_completed_in_place(recovery_sandbox, job, competitors[0], 2, frozen)
    check_resumed_from_memory(job, lost=1)
    final = job.events(0, "done")[-1]["weights_checksum"]
    assert final == undisturbed.checksum(), "the weights differ from the undisturbed run's"


def test_a_frozen_node_of_a_range_job_leaves_the_survivors_training(
    recovery_sandbox: SlurmSandbox,
    jobs: list[SandboxJob],
    frozen: list[int],
    competitors: list[Competitor],
    tmp_path: Path,
) -> None:
    job = SandboxJob(recovery_sandbox, tmp_path / "range", nodes=3, tasks=3)
    jobs.append(job)
    job.submit(ARGS, node_range="2-3", env={"MIN_NODES": "2", "MAX_RESTARTS": "2"})
    wait_until(job, lambda: job.progress() >= 1, 300, "training")
    assert [c["num_workers"] for c in job.events(0, "cluster")] == [3], job.report()
    competitors.append(submit_competitor(recovery_sandbox.sandbox, nodes=2))
    node, workers, seconds = lose_a_node(recovery_sandbox, job, 2, frozen, competitors[0])
    assert seconds < RESUME_WITHIN_S, job.report()
    assert len(workers) == 2, workers
    assert not any(w.startswith(f"{node}:") for w in workers), workers
    clusters = job.events(0, "cluster")
    assert [c["global_batch"] for c in clusters] == [BATCH, BATCH], clusters
    check_completed_in_place(recovery_sandbox, job, competitors[0], 2, frozen)
    check_resumed_from_memory(job, lost=2)
