"""No port ends a job, on the default sandbox (its nodes share one network stack, and it
sets ``MpiParams=ports``):

* every rank of a ``jobs/*.sbatch`` step listens on a port of its step's
  ``SLURM_STEP_RESV_PORTS``, and two 2-node jobs on the same nodes at once never share a
  port; with ``SLURMTF_RESV_PORTS=0`` (a cluster without ``MpiParams=ports``) the ports
  are the documented ``base + rank`` of the job's slot, and still differ (no TensorFlow);
* a stray process that holds rank 1's port before the job starts costs one restart in
  place: the log names the port, the node and the holder, and the job ends COMPLETED at
  its final step with one weights checksum;
* a process of the failed attempt kept alive on a healthy node (here: its old port held
  again as soon as that rank died) does not stop the next attempt;
* a frozen node's rank keeps its port; with a spare the job trains again on the spare
  within 90 s of the freeze, without a requeue.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmtf.cluster import ports
from slurmtf.events import Event, named, read_events
from slurmtf.sandbox import nodefaults
from tests.e2e.conftest import PYTHON, SlurmSandbox, tracked_jobs
from tests.e2e.jobruns import SandboxJob, wait_until

pytestmark = [pytest.mark.slurm]

PROBE = """\
import os, socket, sys, time
from slurmtf.events import emit
from slurmtf.resolver import resolve
layout = resolve()
with socket.socket() as sock:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("", layout.port))  # as TensorFlow's server would: fails on a shared port
    sock.listen()
    start = time.time()
    emit("probe", rank=layout.task_index, port=layout.port, node=layout.node,
         source=layout.port_source, workers=list(layout.workers),
         resv=os.environ.get("SLURM_STEP_RESV_PORTS"), start=start)
    time.sleep(float(sys.argv[1]))
    emit("probe_end", rank=layout.task_index, end=time.time())
"""
STEPS = 40
MODEL = [
    "--batch_size=12", "--eval_steps=1", "--num_threads=1", "--seed=7", "--log_every=1",
    f"--train_steps={STEPS}", "--checkpoint_every=5", "--heartbeat_timeout=10",
]  # fmt: skip


@pytest.fixture
def jobs(slurm_sandbox: SlurmSandbox) -> Iterator[list[SandboxJob]]:
    yield from tracked_jobs()


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes that hold ports for a test; killed at the end."""
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for proc in made:
        proc.kill()
        proc.wait()


def hold(port: int, holders: list[subprocess.Popen[bytes]], tmp_path: Path) -> int:
    """Start a process listening on ``port`` (all addresses); its PID once it listens."""
    ready = tmp_path / f"held-{port}"
    code = (
        "import socket, sys, time\ns = socket.socket()\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('', int(sys.argv[1]))); s.listen()\n"
        "open(sys.argv[2], 'w').write('ok'); time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(port), str(ready)])
    holders.append(proc)
    deadline = time.monotonic() + 10
    while not ready.exists():
        assert proc.poll() is None, f"could not hold port {port}"
        assert time.monotonic() < deadline, f"port {port} not held in time"
        time.sleep(0.05)
    return proc.pid


def probes(job: SandboxJob, name: str = "probe") -> list[Event]:
    return [
        e
        for rank in range(job.tasks)
        for e in named(read_events(job.log_dir / f"rank{rank}.out"), name)
    ]


@pytest.mark.matrix
@pytest.mark.parametrize("reserved", [True, False], ids=["MpiParams=ports", "without"])
def test_two_jobs_on_the_same_nodes_never_share_a_port(
    slurm_sandbox: SlurmSandbox, tmp_path: Path, reserved: bool
) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {} if reserved else {"SLURMTF_RESV_PORTS": "0"}
    pair = [SandboxJob(slurm_sandbox, tmp_path / f"job{i}") for i in range(2)]
    try:
        for job in pair:  # both on node1 and node2 at once (2 fake GPUs each)
            job.submit([str(script), "8"], script="train.sbatch", nodelist="node[1-2]", env=env)
        states = [job.wait(120) for job in pair]
        assert states == ["COMPLETED", "COMPLETED"], "\n".join(j.report() for j in pair)
    finally:
        for job in pair:
            job.cancel()
    found = [probes(job) for job in pair]
    assert [len(f) for f in found] == [2, 2], "\n".join(j.report() for j in pair)
    ends = [max(float(e["end"]) for e in probes(job, "probe_end")) for job in pair]
    starts = [min(float(e["start"]) for e in f) for f in found]
    assert max(starts) < min(ends), "the two jobs did not run at the same time"
    used = [int(e["port"]) for f in found for e in f]
    assert len(set(used)) == 4, found  # nobody shares, on one network stack
    for job, events in zip(pair, found, strict=True):
        for event in events:
            port, rank = int(event["port"]), int(event["rank"])
            if reserved:
                assert event["source"] == "reserved", event
                assert port in ports.parse_reserved_ports(str(event["resv"])), event
                assert ports.parse_reserved_ports(str(event["resv"]))[rank] == port, event
            else:
                assert event["source"] == "job", event
                assert port == ports.derive_port_base(int(job.job_id), 2) + rank, event
        assert "--resv-ports" not in job.job_output()  # nothing printed the option by mistake


@pytest.mark.tf
def test_a_stray_process_on_rank_1s_port_costs_one_restart(
    slurm_sandbox: SlurmSandbox,
    jobs: list[SandboxJob],
    holders: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    """The documented scheme (SLURMTF_RESV_PORTS=0): rank 1's port is known from the job
    id, held before the job starts (submitted held, released once the port is taken)."""
    job = SandboxJob(slurm_sandbox, tmp_path / "stray")
    jobs.append(job)
    job.submit(MODEL, sbatch_args=["--hold"], env={"SLURMTF_RESV_PORTS": "0"})
    port = ports.derive_port_base(int(job.job_id), 2) + 1
    pid = hold(port, holders, tmp_path)
    slurm_sandbox.run(["scontrol", "release", job.job_id])
    assert job.finish() == "COMPLETED", job.report()
    output = job.job_output()
    said = [line for line in output.splitlines() if " in place (" in line]
    print("MEASURED the job's line:", *said)
    assert len(said) == 1, output
    assert f"rank 1's port {port} on node2 was held by pid {pid} (" in said[0], output
    assert "restart 1 in place (1 of 3 without progress, MAX_RESTARTS)" in said[0], output
    assert "restart 2 in place" not in output, output
    held = job.of("port_in_use")[1]
    assert [(e["port"], e["holder_pid"]) for e in held] == [(port, pid)], held
    finals = [job.of("done")[rank][-1] for rank in range(2)]
    assert [f["step"] for f in finals] == [STEPS, STEPS], job.report()
    assert len({f["weights_checksum"] for f in finals}) == 1, finals
    again = job.of("cluster")[1][-1]
    assert all(int(w.rsplit(":", 1)[1]) != port for w in again["workers"]), again
    assert again["restart_count"] == 1, again


@pytest.mark.tf
def test_a_leftover_of_the_failed_attempt_does_not_stop_the_next(
    slurm_sandbox: SlurmSandbox,
    jobs: list[SandboxJob],
    holders: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    """Slurm's reserved ports (the sandbox's MpiParams=ports): rank 1 is killed; the
    moment rank 0 (healthy node) is gone its old port is held again, as by a process of
    the failed attempt that could not be killed. The next attempt takes other ports."""
    job = SandboxJob(slurm_sandbox, tmp_path / "leftover")
    jobs.append(job)
    job.submit(MODEL)
    wait_until(job, lambda: job.progress() >= 5, 300, "step 5")
    (first,) = job.events(0, "cluster")
    old = int(first["workers"][0].rsplit(":", 1)[1])
    old_pid = job.rank_pid(0)
    job.signal_rank(1, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{old_pid}").exists():
        assert time.monotonic() < deadline, "rank 0 of the failed attempt did not end"
        time.sleep(0.02)
    pid = hold(old, holders, tmp_path)
    assert job.finish() == "COMPLETED", job.report()
    clusters = job.of("cluster")[0]
    assert len(clusters) == 2, job.report()
    new = [int(w.rsplit(":", 1)[1]) for w in clusters[1]["workers"]]
    assert old not in new, (old, new)
    assert not job.of("port_in_use")[0], job.report()
    assert holders[-1].pid == pid
    assert holders[-1].poll() is None  # still holding it
    said = (
        "restart 1 in place (0 of 3 without progress: training reached step"  # killed in training
    )
    assert said in job.job_output()
    finals = [job.of("done")[rank][-1] for rank in range(2)]
    assert len({f["weights_checksum"] for f in finals}) == 1, finals


@pytest.fixture
def frozen(slurm_sandbox: SlurmSandbox) -> Iterator[list[int]]:
    pids: list[int] = []
    yield pids
    if not nodefaults.mend(slurm_sandbox.sandbox, pids, timeout=60):
        pytest.fail(f"nodes not back in service: {slurm_sandbox.sandbox.node_states()}")


@pytest.mark.tf
@pytest.mark.slow
def test_a_frozen_node_on_one_network_stack_trains_again_on_the_spare(
    slurm_sandbox: SlurmSandbox, jobs: list[SandboxJob], frozen: list[int], tmp_path: Path
) -> None:
    """The issue's run: SPARE_NODES=1 sbatch -N3 --gres=none jobs/mnist.sbatch; the
    second training node frozen. Its rank keeps its port (one network stack), so the next
    attempt must not be given it (SLURMTF_RESV_PORTS=0: the job's own ports, moved)."""
    job = SandboxJob(slurm_sandbox, tmp_path / "spare", nodes=3)
    jobs.append(job)
    env = {"SPARE_NODES": "1", "MAX_RESTARTS": "2", "SLURMTF_RESV_PORTS": "0"}
    job.submit(MODEL, sbatch_args=["--gres=none"], env=env)
    wait_until(job, lambda: job.progress() >= 8, 300, "step 8")
    node = job.rank_node(1)
    frozen.extend(nodefaults.freeze_node(slurm_sandbox.sandbox, node))
    lost = time.monotonic()
    wait_until(job, lambda: len(job.events(0, "cluster")) >= 2 and job.progress() > 8, 240,
               "training in place")  # fmt: skip
    seconds = time.monotonic() - lost
    print(f"MEASURED {node} frozen -> training again on the spare {seconds:.1f} s")
    assert seconds < 90, job.report()
    workers = job.events(0, "cluster")[-1]["workers"]
    assert not any(w.startswith(f"{node}:") for w in workers), workers
    wait_until(job, lambda: "srun exited 0" in job.job_output(), 300, "the last step")
    nodefaults.thaw_node(frozen)
    assert job.wait(200) == "COMPLETED", job.report()
    output = job.job_output()
    assert "training on a spare (" in output, output
    assert "requeueing" not in output, output
    show = slurm_sandbox.run(["scontrol", "-o", "show", "job", job.job_id]).stdout
    assert "Restarts=0" in show, show
    finals = [job.events(rank, "done")[-1] for rank in range(2)]
    assert [f["step"] for f in finals] == [STEPS, STEPS], job.report()
    assert len({f["weights_checksum"] for f in finals}) == 1, finals


def test_the_resolver_in_a_plain_step_explains_its_ports(slurm_sandbox: SlurmSandbox) -> None:
    """``srun --resv-ports=2 ... --explain`` names the reserved ports in its rule."""
    done = slurm_sandbox.run(
        ["srun", "-N2", "--ntasks-per-node=1", "--gres=none", "--resv-ports=2", PYTHON, "-m",
         "slurmtf.resolver", "--explain"], timeout=60,
    )  # fmt: skip
    rules = [line for line in done.stdout.splitlines() if line.startswith("ports: ")]
    assert len(rules) == 2, done.stdout
    assert all("of SLURM_STEP_RESV_PORTS=" in line for line in rules), rules
    assert len(set(rules)) == 1, rules  # the same reservation on both nodes
