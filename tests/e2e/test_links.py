"""End-to-end: a sandbox whose nodes have their own shaped links (``--link 1gbit``).

One 2-node sandbox for the module: each node in its own network namespace, joined to
a bridge namespace by a veth pair capped with ``tc tbf`` both ways. A 2-node MNIST job
trains across the link, and a bounded TCP transfer between the node namespaces shows
the cap is real (a tighter cap set on the same veths is met, and not exceeded), and a
rate lowered in the middle of a transfer does not stall it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmtf.sandbox import Sandbox, links
from tests.e2e.conftest import SlurmSandbox, require_sandbox_prereqs
from tests.e2e.jobruns import check_training, submit_job
from tests.prereqs import require

pytestmark = pytest.mark.slurm

LINK = "1gbit"
TINY = ["--train_steps=20", "--batch_size=32", "--eval_steps=1", "--log_every=10",
        "--num_threads=1"]  # fmt: skip


@pytest.fixture(scope="module")
def linked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    require_sandbox_prereqs()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, check=False)
    require(netns.returncode == 0, "ip netns (iproute2)")
    sandbox = Sandbox(tmp_path_factory.mktemp("linked"), nodes=2, gpus_per_node=1, link=LINK)
    sandbox.up()
    try:
        yield SlurmSandbox(sandbox)
    finally:
        sandbox.down()


def _plan(linked: SlurmSandbox) -> links.LinkPlan:
    plan = linked.sandbox.config().link_plan
    assert plan is not None
    return plan


def test_nodes_have_own_addresses_and_shaped_links(linked: SlurmSandbox) -> None:
    plan = _plan(linked)
    script = 'echo "$SLURMD_NODENAME $(ip netns identify $$) $(getent hosts node2)"'
    done = linked.run(["srun", "-N2", "bash", "-c", script])
    rows = sorted(line.split() for line in done.stdout.splitlines())
    assert rows == [
        ["node1", plan.node_ns(1), plan.node_addr(2), "node2"],
        ["node2", plan.node_ns(2), plan.node_addr(2), "node2"],
    ]
    qdisc = subprocess.run(["tc", "-n", plan.node_ns(1), "qdisc", "show", "dev", "eth0"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "tbf" in qdisc, qdisc
    assert "rate 1Gbit" in qdisc, qdisc


def test_shaped_throughput(linked: SlurmSandbox) -> None:
    """One TCP stream node1 -> node2 never beats the cap; a 100 Mbit/s cap is met."""
    plan = _plan(linked)
    dst = plan.node_addr(2)
    at_1g = links.measure_tcp(plan.node_ns(1), plan.node_ns(2), dst, seconds=1.5)
    assert at_1g <= 1.05e9, f"{at_1g / 1e9:.3f} Gbit/s through a 1gbit link"
    assert at_1g >= 0.15e9, f"only {at_1g / 1e9:.3f} Gbit/s through a 1gbit link"
    slow = 100_000_000
    try:
        links.reshape(plan, slow)
        at_100m = links.measure_tcp(plan.node_ns(1), plan.node_ns(2), dst, seconds=1.5)
    finally:
        links.reshape(plan, plan.rate_bps)
    print(f"shaped TCP: {at_1g / 1e9:.3f} Gbit/s at 1gbit, {at_100m / 1e6:.1f} Mbit/s at 100mbit")
    assert 0.75 * slow <= at_100m <= 1.05 * slow, f"{at_100m / 1e6:.1f} Mbit/s at 100mbit"


def test_rate_lowered_during_a_transfer(linked: SlurmSandbox) -> None:
    """``sandbox link`` lowers a rate under a running TCP stream: the packets queued under
    the old rate still leave, and the stream goes on at the new one (a bucket smaller than
    a queued 64 KiB packet would hold it forever, and every connection behind it)."""
    plan = _plan(linked)
    result: dict[str, object] = {}

    def stream() -> None:
        try:
            result["bps"] = links.measure_tcp(plan.node_ns(1), plan.node_ns(2),
                                              plan.node_addr(2), seconds=3.0)  # fmt: skip
        except links.LinkError as err:
            result["error"] = err

    transfer = threading.Thread(target=stream)
    transfer.start()
    try:
        time.sleep(1.5)  # the stream runs at 1gbit, queue filled with large packets
        links.reshape_node(plan, 1, 100_000_000)
        transfer.join(timeout=60)
        show = ["tc", "-s", "-n", plan.node_ns(1), "qdisc", "show", "dev", "eth0"]
        backlog = subprocess.run(show, capture_output=True, text=True, check=True).stdout
    finally:
        links.reshape_node(plan, 1, plan.rate_bps)
    assert not transfer.is_alive(), f"the stream stalled after the rate change:\n{backlog}"
    assert "error" not in result, f"the stream failed: {result['error']}\n{backlog}"
    print(f"stream across a 1gbit -> 100mbit change: {float(result['bps']) / 1e6:.0f} Mbit/s")
    assert "backlog 0b 0p" in backlog, backlog


@pytest.mark.tf
def test_mnist_two_nodes_over_shaped_link(linked: SlurmSandbox, tmp_path: Path) -> None:
    require(importlib.util.find_spec("tensorflow") is not None, "TensorFlow (pip install .[cpu])")
    run = submit_job(linked, tmp_path, "mnist-link", script="mnist.sbatch", nodes=2, args=TINY)
    check_training(run)
    workers = run.of("cluster")[0][0]["workers"]
    assert [w.rsplit(":", 1)[0] for w in workers] == ["node1", "node2"]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder short enough for slurmstepd's sockets whatever pytest's base folder is
    (an xdist worker's test folders are longer)."""
    with tempfile.TemporaryDirectory(prefix="sbx-", dir="/tmp") as folder:
        yield Path(folder)


def test_down_removes_every_namespace(short_dir: Path) -> None:
    """After a crash (daemons killed, state left), down and a fresh up leave nothing."""
    require_sandbox_prereqs()
    sandbox = Sandbox(short_dir / "sbx", nodes=1, gpus_per_node=0, link="unshaped")
    sandbox.up()
    plan = sandbox.config().link_plan
    assert plan is not None
    assert sorted(links.existing(plan.prefix)) == sorted(plan.namespaces)
    state = sandbox.state_path.read_text()
    sandbox.down()
    assert links.existing(plan.prefix) == []
    # A crash between creating the namespaces and recording the daemons: the state
    # names the namespaces but no PIDs. A later `down` (a new process) removes them.
    links.create(plan)
    sandbox.state_path.write_text(state.replace('"pids": {', '"pids_gone": {'))
    assert Sandbox(short_dir / "sbx", nodes=1, gpus_per_node=0).down() is True
    assert links.existing(plan.prefix) == []
