"""A wide job through the real job script and supervisor: 8 nodes x 8 stand-in ranks and a
spare (benchmarks/standin.py: the ranks' event protocol and heartbeats, no TensorFlow).

What benchmarks/bench_width.py measures at 16, 256 and 1,024 ranks, asserted here as
behaviour, not timings: every rank starts; the supervisor's look opens the nodes' event
files and srun's stderr, never a rank's log; a SIGKILLed rank is restarted in place; a
frozen node's place is taken by the spare after the chief names it in ``peer_lost`` (in
node1's events file); the job ends COMPLETED; ``slurmtf status`` and ``slurmtf logs``
answer for it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import bench_width, harness
from slurmtf.events import named, read_events
from slurmtf.sandbox import Sandbox, nodefaults
from tests.e2e.conftest import require_sandbox_prereqs
from tests.prereqs import require

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

NODES, TASKS = 8, 8


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    require_sandbox_prereqs()
    require(shutil.which("strace") is not None, "strace (apt-get install strace)")
    sandbox = Sandbox(tmp_path_factory.mktemp("wide"), nodes=NODES + 1, gpus_per_node=0,
                      cpus_per_node=TASKS, link="unshaped")  # fmt: skip
    sandbox.up(timeout=120)
    try:
        yield sandbox
    finally:
        sandbox.down()


def slurmtf(sandbox: Sandbox, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([harness.python(), "-m", "slurmtf", *args], env=sandbox.env(),
                          cwd=harness.REPO, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip


def test_a_64_rank_job_restarts_in_place_and_takes_a_spare(wide: Sandbox, tmp_path: Path) -> None:
    job = bench_width.JobRun(wide, tmp_path, (NODES, TASKS), harness.REPO, seconds=40)
    stopped: list[int] = []
    try:
        harness.wait_until("every rank", lambda: bench_width.ranks_up(job.job_id, 64, set()),
                           600, 1)  # fmt: skip
        harness.wait_until("the chief's first progress", job.training, 300)
        pid = bench_width.supervisor_pid(job.job_id)
        look = bench_width.trace_looks(pid, job.log_dir, "node1", tmp_path)
        assert look["looks"] >= 3, look
        nodes = {f"events-{job.job_id}-node{n}.jsonl" for n in range(1, NODES + 2)}
        # One file per node, srun's stderr and the job's heartbeat: no rank's log.
        job_files = {"srun.err", f"supervisor-{job.job_id}.json"}
        assert set(look["names"]) <= {*nodes, *job_files}, look["names"]

        killed = bench_width.break_and_time(job, "kill", lambda: bench_width.kill_rank(job))
        assert killed["action"] == "restart", killed
        assert "rank 32 was killed by SIGKILL" in killed["line"]

        def freeze() -> None:
            stopped.extend(nodefaults.freeze_node(wide, f"node{NODES}"))

        frozen = bench_width.break_and_time(job, "freeze", freeze)
        assert frozen["action"] == "restart", frozen
        assert f"node{NODES + 1}" in frozen["nodes"], frozen  # the spare
        assert f"node{NODES}" not in frozen["nodes"], frozen
        said = named(read_events(job.log_dir / f"events-{job.job_id}-node1.jsonl"), "peer_lost")
        assert {p["node"] for e in said for p in e["lost"]} == {f"node{NODES}"}, said

        harness.wait_until("the job's end", lambda: not harness.queued(wide, job.job_id), 600, 2)
        assert harness.job_state(wide, job.job_id) == "COMPLETED"
        status = slurmtf(wide, "status", job.job_id)
        assert status.returncode == 0, status.stderr
        assert "COMPLETED" in status.stdout, status.stdout
        assert "restarts 2" in status.stdout, status.stdout
        last = slurmtf(wide, "logs", job.job_id, "--rank=63")
        assert last.returncode == 0, last.stderr
        assert "rank 63: done" in last.stdout, last.stdout
    finally:
        wide.run(["scancel", job.job_id], check=False)
        nodefaults.mend(wide, stopped, timeout=120)
