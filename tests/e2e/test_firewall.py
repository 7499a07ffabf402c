"""End-to-end: the per-job firewall on a sandbox whose nodes have their own addresses.

One 3-node sandbox for the module (``--link 1gbit --job_firewall``): slurmd runs the
firewall's prolog and epilog inside each node's network namespace. A 2-node MNIST job
on node1 and node2 trains while a job on node3 cannot open a TCP connection to its
chief's port (the SYN is dropped: a timeout, where a closed port would refuse at once)
and a job on node2 can; when the job ends, or is cancelled, its table is gone from
every node.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurmtf.cluster import ports
from slurmtf.firewall import rules
from slurmtf.sandbox import Sandbox, links
from tests.e2e.conftest import PYTHON, SlurmSandbox, require_sandbox_prereqs
from tests.e2e.jobruns import check_training, submit_job
from tests.prereqs import require

pytestmark = pytest.mark.slurm

TINY = ["--train_steps=30", "--batch_size=32", "--eval_steps=1", "--log_every=10",
        "--num_threads=1"]  # fmt: skip
# Connect to ADDR:PORT: `open`, `refused` (nothing listens, no firewall) or `timeout`.
PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("open")
except ConnectionRefusedError:
    print("refused")
except TimeoutError:
    print("timeout")
"""


@pytest.fixture(scope="module")
def walled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    require_sandbox_prereqs()
    require(shutil.which("nft") is not None, "nft (apt-get install nftables)")
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, check=False)
    require(netns.returncode == 0, "ip netns (iproute2)")
    # Without MpiParams=ports: a step's reserved ports are not in the job's table (the
    # prolog runs per job, before any step), so a site with the firewall leaves them off.
    sandbox = Sandbox(
        tmp_path_factory.mktemp("walled"), nodes=3, gpus_per_node=1, link="1gbit",
        job_firewall=True, resv_ports=False,
    )  # fmt: skip
    sandbox.up()
    try:
        yield SlurmSandbox(sandbox)
    finally:
        sandbox.down()


def _plan(walled: SlurmSandbox) -> links.LinkPlan:
    plan = walled.sandbox.config().link_plan
    assert plan is not None
    return plan


def _tables(walled: SlurmSandbox) -> dict[str, set[str]]:
    """The slurmtf tables on each node, as nft lists them in the node's namespace."""
    plan, found = _plan(walled), {}
    for i in range(1, walled.nodes + 1):
        done = subprocess.run(
            ["ip", "netns", "exec", plan.node_ns(i), "nft", "list", "tables"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        found[f"node{i}"] = {
            line.split()[-1] for line in done.stdout.splitlines() if rules.TABLE_PREFIX in line
        }
    return found


def _until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} after {timeout}s"
        time.sleep(0.3)


def _holding(walled: SlurmSandbox, table: str) -> set[str]:
    return {node for node, tables in _tables(walled).items() if table in tables}


def _probe(walled: SlurmSandbox, node: str, address: str, port: int) -> subprocess.Popen[str]:
    """A one-task job on ``node`` that connects to ``address:port``."""
    return subprocess.Popen(
        ["srun", "-N1", "-n1", f"--nodelist={node}", "--gres=none", "--time=2",
         PYTHON, "-c", PROBE, address, str(port)],
        env=walled.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _log(walled: SlurmSandbox, node: str) -> str:
    path = walled.dir / "log" / f"firewall-{node}.log"
    return path.read_text() if path.exists() else ""


@pytest.mark.tf
def test_only_the_jobs_nodes_reach_its_workers(walled: SlurmSandbox, tmp_path: Path) -> None:
    require(importlib.util.find_spec("tensorflow") is not None, "TensorFlow (pip install .[cpu])")
    run = submit_job(
        walled, tmp_path, "mnist-walled", script="mnist.sbatch", nodes=2, args=TINY,
        sbatch_args=["--nodelist=node1,node2"],
    )  # fmt: skip
    table = rules.table_name(int(run.job_id))
    _until(lambda: _holding(walled, table) == {"node1", "node2"}, f"no {table} on node1+2")
    chief_port = ports.derive_port_base(int(run.job_id), 2)  # rank 0, on node1
    node1 = _plan(walled).node_addr(1)
    outsider = _probe(walled, "node3", node1, chief_port)
    insider = _probe(walled, "node2", node1, chief_port)
    seen = {
        name: p.communicate(timeout=60) for name, p in (("node3", outsider), ("node2", insider))
    }
    assert run.state() not in {"COMPLETED", "FAILED"}, f"the job ended before the probes\n{seen}"
    assert seen["node3"][0].split() == ["timeout"], seen
    assert seen["node2"][0].split() in (["open"], ["refused"]), seen

    check_training(run)
    workers = run.of("cluster")[0][0]["workers"]
    assert workers == [f"node1:{chief_port}", f"node2:{chief_port + 1}"]
    _until(lambda: not _holding(walled, table), f"{table} left on {_holding(walled, table)}")
    for node in ("node1", "node2"):
        log = _log(walled, node)
        assert f"prolog job {run.job_id} on {node}: table {table} added" in log, log
        assert f"epilog job {run.job_id} on {node}: table {table} removed" in log, log
    assert f"job {run.job_id} " not in _log(walled, "node3")


def test_a_cancelled_jobs_table_goes_too(walled: SlurmSandbox) -> None:
    done = walled.run(
        ["sbatch", "--parsable", "-N2", "--nodelist=node1,node2", "--gres=none", "--time=5",
         "--output=/dev/null", "--wrap=sleep 300"],
    )  # fmt: skip
    job_id = done.stdout.strip().split(";")[0]
    table = rules.table_name(int(job_id))
    _until(lambda: _holding(walled, table) == {"node1", "node2"}, f"no {table} on node1+2")
    walled.run(["scancel", job_id])
    assert walled.wait(job_id, timeout=60) == "CANCELLED"
    _until(lambda: not _holding(walled, table), f"{table} left on {_holding(walled, table)}")
    assert "NOT done" not in _log(walled, "node1") + _log(walled, "node2")
