"""Faults on the local Slurm sandbox: a rank unable to bind its port, two jobs at once.

Each test submits ``jobs/mnist.sbatch`` on sandbox nodes and checks what the user gets.
A killed, frozen or lost rank is in ``test_recovery.py`` (the job requeues itself and
resumes); the live-job helpers are in ``tests/e2e/jobruns.py``.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from slurmtf.cluster.ports import free_port_base
from tests.e2e.conftest import TERMINAL, SlurmSandbox
from tests.e2e.jobruns import FAST, SandboxJob, new_job, wait_terminal, wait_until
from tests.helpers.localjobs import report

pytestmark = [pytest.mark.slurm, pytest.mark.tf, pytest.mark.slow]


def test_a_taken_port_fails_the_job_at_once_naming_it(
    slurm_sandbox: SlurmSandbox, jobs: list[SandboxJob], tmp_path: Path
) -> None:
    """All sandbox nodes share this machine's network: hold rank 1's port here. The base
    is fixed (SLURMTF_PORT_BASE), so a restart would meet the same port: the job stops
    and says what to do (a base slurmtf chose moves instead: tests/e2e/test_ports.py)."""
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
    said = job.job_output()
    assert f"rank 1's port {base + 1} on node2 was held by " in said, job.report()
    assert "so slurmtf does not move them. HINT: " in said, job.report()


def test_two_jobs_on_the_same_nodes_at_once_both_train(
    slurm_sandbox: SlurmSandbox, jobs: list[SandboxJob], tmp_path: Path
) -> None:
    first = new_job(jobs, slurm_sandbox, tmp_path, "first")
    second = new_job(jobs, slurm_sandbox, tmp_path, "second")
    args = [*FAST, "--train_steps=40", "--log_every=5"]
    first.submit(args, nodelist="node1,node2")
    second.submit(args, nodelist="node1,node2")
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
