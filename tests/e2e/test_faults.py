"""Faults on the local Slurm sandbox: a rank unable to bind its port, two jobs at once.

Each test submits ``jobs/mnist.sbatch`` on sandbox nodes and checks what the user gets.
``SandboxJob`` and ``rank_pids`` (a rank's Python process found through ``/proc`` by job
id and rank, signalled by PID) serve the preemption and recovery tests too; a killed,
frozen or lost rank is in ``test_recovery.py`` (the job requeues itself and resumes).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from slurmtf.localstep import free_port_base
from tests.e2e.conftest import REPO, TERMINAL, SlurmSandbox
from tests.helpers.localjobs import report
from tests.prereqs import require

pytestmark = [pytest.mark.slurm, pytest.mark.tf, pytest.mark.slow]

FAST = ["--batch_size=16", "--eval_steps=1", "--num_threads=1", "--seed=5"]
LONG = [*FAST, "--train_steps=100000", "--log_every=5", "--checkpoint_every=10"]


@dataclass
class SandboxJob:
    """One ``jobs/mnist.sbatch`` submission and its files."""

    sandbox: SlurmSandbox
    run_dir: Path
    job_id: str = ""
    signalled: list[int] = field(default_factory=list)
    final: str = ""  # kept: squeue forgets a finished job after MinJobAge

    @property
    def model_dir(self) -> Path:
        return self.run_dir / "model"

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    def submit(self, args: list[str], *, nodes: str = "", env: dict[str, str] | None = None) -> str:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        sbatch = ["-N2", "--time=10", f"--output={self.run_dir}/job-%j.out", "--job-name=faults"]
        if nodes:
            sbatch.append(f"--nodelist={nodes}")
        run_env = {"MODEL_DIR": str(self.model_dir), "LOG_DIR": str(self.log_dir), **(env or {})}
        self.final = ""
        self.job_id = self.sandbox.submit(
            REPO / "jobs" / "mnist.sbatch", *args, sbatch_args=sbatch, env=run_env
        )
        return self.job_id

    def state(self) -> str:
        if not self.final:
            state = self.sandbox.state(self.job_id)
            if state not in TERMINAL:
                return state
            self.final = state
        return self.final

    def wait(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.state() in TERMINAL:
                return self.final
            time.sleep(0.5)
        logs = self.report()
        self.cancel()
        raise TimeoutError(f"job {self.job_id} still {self.state()!r} after {timeout} s\n{logs}")

    def cancel(self) -> None:
        if self.job_id and self.state() not in TERMINAL:
            self.sandbox.run(["scancel", self.job_id], check=False)

    def rank_pid(self, rank: int) -> int | None:
        """PID of this job's ``python -m models.mnist`` for ``rank``, found in /proc."""
        for pid in rank_pids(self.job_id, rank):
            return pid
        return None

    def signal_rank(self, rank: int, signum: int) -> int:
        pid = self.rank_pid(rank)
        assert pid is not None, f"no process for rank {rank} of job {self.job_id}\n{self.report()}"
        os.kill(pid, signum)
        self.signalled.append(pid)
        return pid

    def release(self) -> None:
        """Resume and kill every process this test stopped (by PID), if still there."""
        for pid in self.signalled:
            for signum in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)

    def text(self, name: str) -> str:
        path = self.log_dir / name
        return path.read_text(errors="replace") if path.exists() else ""

    def job_output(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.run_dir.glob("*.out")))

    def events(self, rank: int, name: str) -> list[dict[str, Any]]:
        found = []
        for line in self.text(f"rank{rank}.out").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if record.get("event") == name:
                        found.append(record)
        return found

    def progress(self) -> int:
        """Highest step rank 0 has logged (``step N/M``), else 0."""
        steps = [
            int(word.split("/")[0])
            for line in self.text("rank0.err").splitlines()
            for word in line.split("step ")[1:2]
            if word.split("/")[0].isdigit()
        ]
        return max(steps, default=0)

    def report(self) -> str:
        parts = [f"job {self.job_id} state {self.state()!r}, run dir {self.run_dir}"]
        parts.append(f"--- job output:\n{self.job_output()[-3000:]}")
        for path in sorted(self.log_dir.glob("rank*")):
            parts.append(f"--- {path.name}:\n{path.read_text(errors='replace')[-3000:]}")
        parts.append(self.sandbox.logs(self.job_id))
        return "\n".join(parts)


def rank_pids(job_id: str, rank: int) -> list[int]:
    """Python processes of job ``job_id`` whose ``SLURM_PROCID`` is ``rank``."""
    want = {b"SLURM_JOB_ID": job_id.encode(), b"SLURM_PROCID": str(rank).encode()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if not Path(argv[0].decode()).name.startswith("python") or b"models.mnist" not in argv:
                continue
            items = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        environ = dict(item.split(b"=", 1) for item in items if b"=" in item)
        if all(environ.get(key) == value for key, value in want.items()):
            found.append(int(entry.name))
    return found


def wait_until(job: SandboxJob, condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if job.state() in TERMINAL:
            break
        time.sleep(0.3)
    job.cancel()
    pytest.fail(f"{what} did not happen within {timeout:.0f} s\n{job.report()}")


def wait_terminal(job: SandboxJob, since: float, timeout: float) -> tuple[str, float]:
    """Final state and seconds from ``since`` until Slurm reported it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = job.state()
        if state in TERMINAL:
            return state, time.monotonic() - since
        time.sleep(0.3)
    job.cancel()
    pytest.fail(f"job {job.job_id} still running {timeout:.0f} s after the fault\n{job.report()}")


@pytest.fixture
def jobs(slurm_sandbox: SlurmSandbox, tmp_path: Path) -> Iterator[list[SandboxJob]]:
    require(importlib.util.find_spec("tensorflow") is not None, "TensorFlow (pip install .[cpu])")
    made: list[SandboxJob] = []
    yield made
    for job in made:
        job.cancel()
        job.release()
    for job in made:
        if job.job_id:
            print(job.report())  # shown by pytest only when the test failed


def new_job(jobs: list[SandboxJob], sandbox: SlurmSandbox, root: Path, name: str) -> SandboxJob:
    job = SandboxJob(sandbox, root / name)
    jobs.append(job)
    return job


def test_a_taken_port_fails_the_job_at_once_naming_it(
    slurm_sandbox: SlurmSandbox, jobs: list[SandboxJob], tmp_path: Path
) -> None:
    """All sandbox nodes share this machine's network: hold rank 1's port here."""
    base = free_port_base(2)
    job = new_job(jobs, slurm_sandbox, tmp_path, "port")
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", base + 1))
        squatter.listen()
        job.submit([*FAST, "--train_steps=20"], env={"SLURMTF_PORT_BASE": str(base)})
        wait_until(job, lambda: job.state() not in {"", "PENDING", "CONFIGURING"}, 120, "start")
        started = time.monotonic()
        state, seconds = wait_terminal(job, started, 120)
    report("sandbox_port_taken_job_end", seconds)
    assert state == "FAILED", job.report()
    assert f":{base + 1}" in job.text("rank1.err"), job.report()
    assert "HINT:" in job.text("rank1.err"), job.report()


def test_two_jobs_on_the_same_nodes_at_once_both_train(
    slurm_sandbox: SlurmSandbox, jobs: list[SandboxJob], tmp_path: Path
) -> None:
    first = new_job(jobs, slurm_sandbox, tmp_path, "first")
    second = new_job(jobs, slurm_sandbox, tmp_path, "second")
    args = [*FAST, "--train_steps=40", "--log_every=5"]
    first.submit(args, nodes="node1,node2")
    second.submit(args, nodes="node1,node2")
    overlap = False
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        states = (first.state(), second.state())
        overlap = overlap or states == ("RUNNING", "RUNNING")
        if all(s in TERMINAL for s in states):
            break
        time.sleep(0.5)
    assert first.wait(60) == "COMPLETED", first.report()
    assert second.wait(60) == "COMPLETED", second.report()
    assert overlap, "the two jobs never ran at the same time"
    workers = [tuple(job.events(0, "cluster")[0]["workers"]) for job in (first, second)]
    ports = [{w.rsplit(":", 1)[1] for w in ws} for ws in workers]
    assert not ports[0] & ports[1], f"two jobs on the same nodes share ports: {workers}"
    for job in (first, second):
        assert [job.events(r, "done")[-1]["step"] for r in (0, 1)] == [40, 40], job.report()
