"""End-to-end: ``jobs/parameter_server.sbatch examples/parameter_server.py`` on 3 nodes.

The job's default shape: ``chief:1,ps:2,worker`` over 5 tasks (chief and both ps on
node1, one worker on node2 and node3). A run completes with a falling loss and leaves no
process behind; a worker killed mid-run is tolerated and the run completes without a
restart; a ps killed mid-run requeues the job, which resumes from its checkpoint.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from slurmtf.events import named, read_events
from tests.e2e.conftest import REPO, SlurmSandbox
from tests.e2e.jobruns import SandboxJob, rank_pids, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.tf, pytest.mark.slow]

SCRIPT = "parameter_server.sbatch"
ROLES = {0: "chief", 1: "ps 0", 2: "ps 1", 3: "worker 0", 4: "worker 1"}
# Tiny steps; a checkpoint every 5 steps. The servers wait long for the chief: several
# TensorFlow processes share two cores in CI.
ARGS = ["--log_every=5", "--checkpoint_every=5"]
ENV = {"SERVE_ARGS": "--start_timeout=900", "TF_CPP_MIN_LOG_LEVEL": "2"}
SERVE = "slurmtf.serve"


def submit(sandbox: SlurmSandbox, run_dir: Path, args: list[str]) -> SandboxJob:
    """``sbatch jobs/parameter_server.sbatch examples/parameter_server.py ARGS`` with the
    script's own shape (no -N/-n given)."""
    job = SandboxJob(sandbox, run_dir, nodes=3, tasks=5, timeout=900)
    run_dir.mkdir(parents=True, exist_ok=True)
    job.job_id = sandbox.submit(
        REPO / "jobs" / SCRIPT,
        "examples/parameter_server.py",
        *ARGS,
        *args,
        sbatch_args=["--time=20", f"--job-name={run_dir.name}", f"--output={run_dir}/%x-%j.out"],
        env={"MODEL_DIR": str(job.model_dir), "LOG_DIR": str(job.log_dir), **ENV},
    )
    return job


def job_processes(job_id: str) -> list[int]:
    """PIDs of every process on this machine that belongs to job ``job_id``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            items = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in items:
            found.append(int(entry.name))
    return found


def restarts(sandbox: SlurmSandbox, job_id: str) -> int:
    show = sandbox.run(["scontrol", "-o", "show", "job", job_id]).stdout
    return int(show.split("Restarts=", 1)[1].split()[0])


def chief_step(job: SandboxJob) -> int:
    return max((e["step"] for e in job.events(0, "progress")), default=0)


def kill_when_trained(job: SandboxJob, rank: int, steps: int) -> int:
    """SIGKILL rank ``rank``'s server once the chief has reported ``steps`` steps."""
    wait_until(job, lambda: chief_step(job) >= steps, 600, f"{steps} steps of the chief")
    pids = rank_pids(job.job_id, rank, module=SERVE)
    assert pids, f"no server process for rank {rank}\n{job.report()}"
    for pid in pids:
        job.signalled.append(pid)
        os.kill(pid, signal.SIGKILL)
    return pids[0]


def check_completed(job: SandboxJob, total: int) -> list[dict[str, object]]:
    """COMPLETED, the chief's ``done`` at ``total`` steps, every server stopped by
    itself, no process of the job left; returns the chief's ``cluster`` events."""
    assert job.finish() == "COMPLETED", job.report()
    chief = read_events(job.log_dir / "rank0.out")
    (done,) = named(chief, "done")[-1:]
    assert done["step"] == total, job.report()
    assert done["preempted"] is False
    clusters = named(chief, "cluster")
    for cluster in clusters:
        assert cluster["strategy"] == "ParameterServerStrategy"
        assert len(cluster["ps"]) == 2, cluster
        assert len(cluster["workers"]) == 2, cluster
        assert cluster["table_shards"] == 2  # the embedding table, split over the ps
    for rank, role in list(ROLES.items())[1:]:
        assert f"slurmtf serve: {role} serving at" in job.text(f"rank{rank}.err"), job.report()
    assert job_processes(job.job_id) == [], job.report()
    return clusters


def test_parameter_server_job_completes_and_leaves_nothing(
    slurm_sandbox: SlurmSandbox, tmp_path: Path
) -> None:
    job = submit(slurm_sandbox, tmp_path / "ps_ok", ["--train_steps=20"])
    check_completed(job, 20)
    (done,) = job.events(0, "done")
    assert done["start_step"] == 0
    assert done["first_loss"] > done["last_loss"], done
    for rank in (1, 2, 3, 4):
        assert "stopped answering: its script ended" in job.text(f"rank{rank}.err"), job.report()
    assert "srun exited 0" in job.job_output(), job.report()
    assert restarts(slurm_sandbox, job.job_id) == 0
    checkpoints = sorted(p.name for p in (job.model_dir / "checkpoints").glob("ckpt-*.index"))
    assert checkpoints[-1] == "ckpt-20.index", checkpoints


def test_a_killed_worker_is_tolerated(slurm_sandbox: SlurmSandbox, tmp_path: Path) -> None:
    job = submit(slurm_sandbox, tmp_path / "ps_worker", ["--train_steps=40", "--step_delay=0.2"])
    try:
        kill_when_trained(job, 4, 5)
        check_completed(job, 40)
    finally:
        job.cancel()
        job.release()
    assert restarts(slurm_sandbox, job.job_id) == 0, job.report()
    assert "tolerated the loss of worker rank 4 (SIGKILL)" in job.job_output(), job.report()
    assert len(job.events(0, "cluster")) == 1  # one attempt


def test_a_killed_ps_restarts_from_the_checkpoint(
    slurm_sandbox: SlurmSandbox, tmp_path: Path
) -> None:
    job = submit(slurm_sandbox, tmp_path / "ps_ps", ["--train_steps=40", "--step_delay=0.2"])
    try:
        kill_when_trained(job, 1, 5)
        clusters = check_completed(job, 40)
    finally:
        job.cancel()
        job.release()
    assert restarts(slurm_sandbox, job.job_id) == 1, job.report()
    assert "rank 1 was killed by SIGKILL: requeueing" in job.job_output(), job.report()
    assert len(clusters) == 2, job.report()
    assert clusters[0]["restored"] is None
    assert "ckpt-" in str(clusters[1]["restored"]), clusters
    done = job.events(0, "done")[-1]
    assert done["start_step"] >= 5, done  # resumed, not started over
