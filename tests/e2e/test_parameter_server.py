"""End-to-end: ``jobs/parameter_server.sbatch examples/parameter_server.py`` on 3 nodes.

The job's default shape: ``chief:1,ps:2,worker`` over 5 tasks (chief and both ps on
node1, one worker on node2 and node3). A run completes with a falling loss and leaves no
process behind; a worker killed mid-run is tolerated and the run completes without a
restart; a ps killed mid-run restarts the step in place (a new srun in the same
allocation, Slurm's Restarts stays 0), which resumes from its checkpoint; and
``slurmtf submit --jobs=chief:1,ps:2,worker:2`` runs the same shape; and the README's
heterogeneous form (chief and ps on component 0, the workers on component 1) completes.
The jobs are submitted together and run side by side as the nodes allow.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmtf.cluster.ports import free_port_base
from slurmtf.events import named, read_events
from tests.e2e.conftest import PYTHON, REPO, SlurmSandbox
from tests.e2e.jobruns import SandboxJob, first_count, rank_pids

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
        env={
            "MODEL_DIR": str(job.model_dir),
            "LOG_DIR": str(job.log_dir),
            # free ports now: other sandboxes on this machine derive theirs from job ids too
            "SLURMTF_PORT_BASE": str(free_port_base(5)),
            **ENV,
        },
    )
    return job


# name -> the example's flags; the killed runs go slower, so that the kill lands mid-run.
RUNS = {
    "ok": ["--train_steps=20"],
    "worker": ["--train_steps=40", "--step_delay=0.2"],
    "ps": ["--train_steps=40", "--step_delay=0.2"],
}


@pytest.fixture(scope="module")
def ps_jobs(
    slurm_sandbox: SlurmSandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, SandboxJob]]:
    """The three jobs of this module, submitted at once; cancelled and released at the end."""
    root = tmp_path_factory.mktemp("ps")
    made = {name: submit(slurm_sandbox, root / f"ps_{name}", args) for name, args in RUNS.items()}
    made["submit"] = submit_jobs(slurm_sandbox, root / "ps_submit")
    made["het"] = submit_het(slurm_sandbox, root / "ps_het")
    kill_when_saved([(made["worker"], 4), (made["ps"], 1)], 5)  # worker 1, ps 0
    yield made
    for job in made.values():
        job.cancel()
        job.release()


def submit_jobs(sandbox: SlurmSandbox, run_dir: Path) -> SandboxJob:
    """``slurmtf submit --command="python examples/parameter_server.py" --jobs=...``."""
    job = SandboxJob(sandbox, run_dir, nodes=3, tasks=5, timeout=900)
    command = f"{PYTHON} examples/parameter_server.py"
    done = sandbox.run(
        [PYTHON, "-m", "slurmtf.submit", f"--command={command}", "--jobs=chief:1,ps:2,worker:2",
         "--nodes=3", "--time=20", f"--log_dir={run_dir}", "--", "--train_steps=10"],
        timeout=240,
        env={"SLURMTF_PORT_BASE": str(free_port_base(5)), "MODEL_DIR": str(job.model_dir),
             **ENV},
    )  # fmt: skip
    found = re.search(r"submitted job (\d+): 3 node\(s\), roles chief:1,ps:2,worker:2", done.stdout)
    assert found, done.stdout
    job.job_id = found.group(1)
    return job


# The README's heterogeneous form, as a user types it (tiny steps added).
HET_JOBS = "chief:1@0,ps@0,worker@1"
HET_SHAPE = ["-N1", "-n3", ":", "-N2", "--ntasks-per-node=1"]


def submit_het(sandbox: SlurmSandbox, run_dir: Path) -> SandboxJob:
    """``SLURMTF_JOBS=chief:1@0,ps@0,worker@1 sbatch -N1 -n3 : -N2 --ntasks-per-node=1
    jobs/parameter_server.sbatch examples/parameter_server.py``."""
    job = SandboxJob(sandbox, run_dir, nodes=3, tasks=5, timeout=900)
    run_dir.mkdir(parents=True, exist_ok=True)
    job.job_id = sandbox.submit(
        REPO / "jobs" / SCRIPT, "examples/parameter_server.py", *ARGS, "--train_steps=10",
        sbatch_args=["--time=20", f"--job-name={run_dir.name}", f"--output={run_dir}/%x-%j.out",
                     *HET_SHAPE],
        env={"SLURMTF_JOBS": HET_JOBS, "MODEL_DIR": str(job.model_dir),
             "LOG_DIR": str(job.log_dir), "SLURMTF_PORT_BASE": str(free_port_base(5)), **ENV},
    )  # fmt: skip
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


def saved_step(job: SandboxJob) -> int:
    return max((e["step"] for e in job.events(0, "checkpoint")), default=0)


def kill_when_saved(
    targets: list[tuple[SandboxJob, int]], steps: int, timeout: float = 600
) -> None:
    """SIGKILL the server of each (job, rank) as soon as that job's chief has saved a
    checkpoint at ``steps`` or later (the jobs run side by side)."""
    deadline = time.monotonic() + timeout
    left = list(targets)
    while left and time.monotonic() < deadline:
        for job, rank in list(left):
            if saved_step(job) >= steps:
                pids = rank_pids(job.job_id, rank, module=SERVE)
                assert pids, f"no server process for rank {rank}\n{job.report()}"
                for pid in pids:
                    job.signalled.append(pid)
                    os.kill(pid, signal.SIGKILL)
                left.remove((job, rank))
        time.sleep(0.3)
    for job, _ in left:
        pytest.fail(f"no checkpoint at step {steps} within {timeout:.0f} s\n{job.report()}")


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


@pytest.mark.matrix
def test_parameter_server_job_completes_and_leaves_nothing(
    slurm_sandbox: SlurmSandbox, ps_jobs: dict[str, SandboxJob]
) -> None:
    job = ps_jobs["ok"]
    check_completed(job, 20)
    (done,) = job.events(0, "done")
    assert done["start_step"] == 0
    assert done["first_loss"] > done["last_loss"], done
    for rank in (1, 2, 3, 4):
        # the chief's port closed, or its shell wrote the done file: whichever came first
        assert "slurmtf serve: stopping: the " in job.text(f"rank{rank}.err"), job.report()
    assert "srun exited 0" in job.job_output(), job.report()
    assert restarts(slurm_sandbox, job.job_id) == 0
    checkpoints = sorted(p.name for p in (job.model_dir / "checkpoints").glob("ckpt-*.index"))
    assert checkpoints[-1] == "ckpt-20.index", checkpoints


def test_a_killed_worker_is_tolerated(
    slurm_sandbox: SlurmSandbox, ps_jobs: dict[str, SandboxJob]
) -> None:
    job = ps_jobs["worker"]
    check_completed(job, 40)
    assert restarts(slurm_sandbox, job.job_id) == 0, job.report()
    assert "tolerated the loss of worker rank 4 (SIGKILL)" in job.job_output(), job.report()
    assert len(job.events(0, "cluster")) == 1  # one attempt


def test_a_killed_ps_restarts_in_place_from_the_checkpoint(
    slurm_sandbox: SlurmSandbox, ps_jobs: dict[str, SandboxJob]
) -> None:
    job = ps_jobs["ps"]
    clusters = check_completed(job, 40)
    assert restarts(slurm_sandbox, job.job_id) == 0, job.report()  # never left the allocation
    said = (
        r"restart 1 in place \(" + first_count(r"\d+") + r", MAX_RESTARTS\), \d+\.\d s after "
        r"rank 1 was killed by SIGKILL"
    )
    assert re.search(said, job.job_output()), job.report()
    assert "requeueing job" not in job.job_output(), job.report()
    assert len(clusters) == 2, job.report()
    assert clusters[0]["restored"] is None
    assert "ckpt-" in str(clusters[1]["restored"]), clusters
    done = job.events(0, "done")[-1]
    assert done["start_step"] >= 5, done  # resumed, not started over


def test_submit_jobs_runs_the_same_shape(
    slurm_sandbox: SlurmSandbox, ps_jobs: dict[str, SandboxJob]
) -> None:
    job = ps_jobs["submit"]
    assert job.finish() == "COMPLETED", job.report()
    logs = {rank: job.run_dir / f"{job.job_id}_{rank}_log" for rank in ROLES}
    (done,) = named(read_events(Path(f"{logs[0]}.out")), "done")
    assert done["step"] == 10, done
    for rank, role in list(ROLES.items())[1:]:
        err = Path(f"{logs[rank]}.err").read_text(errors="replace")
        assert f"slurmtf serve: {role} serving at" in err, err[-2000:]
        assert "slurmtf serve: stopping: the " in err, err[-2000:]
    assert job_processes(job.job_id) == [], job.report()


@pytest.mark.matrix
def test_the_heterogeneous_form_completes(
    slurm_sandbox: SlurmSandbox, ps_jobs: dict[str, SandboxJob]
) -> None:
    job = ps_jobs["het"]
    assert job.finish() == "COMPLETED", job.report()
    chief = read_events(job.log_dir / "rank0.out")
    (done,) = named(chief, "done")
    assert done["step"] == 10, job.report()
    (cluster,) = named(chief, "cluster")
    assert cluster["strategy"] == "ParameterServerStrategy"
    # component 0 (one node) holds the chief and both ps, component 1 the two workers
    assert {a.rsplit(":", 1)[0] for a in cluster["ps"]} == {"node1"}, cluster
    assert sorted(a.rsplit(":", 1)[0] for a in cluster["workers"]) == ["node2", "node3"]
    served = " ".join(p.read_text(errors="replace") for p in job.log_dir.glob("rank*.err"))
    for role in ("ps 0", "ps 1", "worker 0", "worker 1"):
        assert f"slurmtf serve: {role} serving at" in served, job.report()
    assert job_processes(job.job_id) == [], job.report()
