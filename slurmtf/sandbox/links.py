"""Sandbox nodes joined by real, rate-limited links (``slurmtf sandbox up --link 1gbit``).

Each node gets a network namespace of its own (``<prefix>-node1`` ...) with one veth
interface ``eth0``; the other end of every veth sits in a bridge namespace
(``<prefix>-br``) that also holds the controller's address. Both directions of each
veth are shaped with a token bucket (``tc qdisc ... tbf``), so a node's link carries at
most ``rate`` each way, like a full-duplex NIC on a switch. Everything is created
inside namespaces the sandbox made: the host's interfaces, routes and firewall are
never touched. Namespace names start with a per-directory prefix and are recorded in
the sandbox state, so ``down`` (or the next ``up``) removes them even after a crash.

The address plan, the rate parsing and every ``ip``/``tc`` command are pure functions
of values; :func:`create` and :func:`destroy` only run the commands they are given.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slurmtf.errors import InputError, SlurmtfError

_RATE = re.compile(r"^(\d+(?:\.\d+)?)(k|m|g)bit$")
_SCALE = {"k": 1e3, "m": 1e6, "g": 1e9}
MIN_RATE_BPS = 1_000_000  # 1 Mbit/s: below this Slurm's own traffic times out
MAX_RATE_BPS = 400_000_000_000
UNSHAPED = "unshaped"
NETNS_DIR = "/run/netns"
BRIDGE = "br0"
NODE_IF = "eth0"
CTLD_HOST = 254
# Queue at most this long behind the token bucket before dropping (like a switch port).
TBF_LATENCY_MS = 20
# The bucket must hold the largest packet a veth queues (a 64 KiB GSO packet): tbf splits
# a packet larger than its bucket only as it is queued, so when a rate is lowered on a busy
# link, a packet queued under the old, larger bucket would never leave, and the TCP
# connection behind it would time out (measured: 1gbit -> 100mbit with a 50 KB bucket).
TBF_MIN_BURST = 128 * 1024

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


class LinkError(SlurmtfError, RuntimeError):
    """Creating or removing the sandbox's namespaces, veths or qdiscs failed."""


def parse_rate(text: str, name: str = "--link") -> int:
    """``1gbit`` -> 1_000_000_000 bits/s; ``unshaped`` -> 0 (namespaces, no shaping).

    Units are tc's bit units (``kbit``, ``mbit``, ``gbit``); tc's ``bps`` means BYTES
    per second, a classic trap, so it is refused rather than guessed. ``name`` is the
    flag an error names.
    """
    value = text.strip().lower()
    if value == UNSHAPED:
        return 0
    match = _RATE.match(value)
    hint = "use a rate in bits per second such as 1gbit, 2.5gbit, 10gbit or 100mbit, or unshaped"
    if not match:
        raise InputError(name, text, "is not a link rate", hint)
    bps = round(float(match.group(1)) * _SCALE[match.group(2)])
    if not MIN_RATE_BPS <= bps <= MAX_RATE_BPS:
        raise InputError(name, text, "must be between 1mbit and 400gbit", hint)
    return bps


def parse_node_link(text: str, nodes: int) -> tuple[int, int]:
    """``node3=100mbit`` -> (3, 100_000_000): one node's own rate (``--node_link``)."""
    hint = f"use NODE=RATE with NODE one of node1..node{nodes}, e.g. node{nodes}=100mbit"
    node, sep, rate = text.strip().partition("=")
    match = re.fullmatch(r"node([1-9]\d*)", node.strip())
    if not sep or not match or int(match.group(1)) > nodes:
        raise InputError("--node_link", text, "does not name a node of this sandbox", hint)
    return int(match.group(1)), parse_rate(rate, "--node_link")


def format_rate(bps: int) -> str:
    """The tc spelling of a rate in bits/s: 2_500_000_000 -> ``2500mbit``."""
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps % scale == 0:
            return f"{bps // scale}{unit}"
    return f"{bps}bit"


def tbf_burst(bps: int) -> int:
    """Bucket size in bytes: 4 ms at the rate (one 250 Hz tick), at least 128 KiB."""
    return max(TBF_MIN_BURST, bps // 8 // 250)


def tc_shape(netns: str, dev: str, bps: int) -> list[str]:
    """The ``tc`` command that caps ``dev``'s egress in ``netns`` at ``bps``."""
    return ["tc", "-n", netns, "qdisc", "replace", "dev", dev, "root", "tbf",
            "rate", format_rate(bps), "burst", str(tbf_burst(bps)),
            "latency", f"{TBF_LATENCY_MS}ms"]  # fmt: skip


def tc_unshape(netns: str, dev: str) -> list[str]:
    """The ``tc`` command that removes the cap (back to the default queue)."""
    return ["tc", "-n", netns, "qdisc", "del", "dev", dev, "root"]


@dataclass(frozen=True)
class LinkPlan:
    """Names and addresses of one sandbox's network: ``nodes`` hosts on one bridge.

    ``prefix`` is unique per sandbox directory; ``subnet`` is the third octet of
    ``10.250.<subnet>.0/24`` (private and only ever configured inside our namespaces).
    """

    prefix: str
    nodes: int
    rate_bps: int
    subnet: int = 0
    node_rates: tuple[tuple[int, int], ...] = ()  # (node index, bits/s): a node's own rate

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9]{1,10}", self.prefix):
            raise InputError("prefix", self.prefix, "must be 1-10 of a-z0-9", "use the default")
        if not 1 <= self.nodes < CTLD_HOST:
            raise InputError("--nodes", self.nodes, f"must be 1..{CTLD_HOST - 1}", "use e.g. 2")
        if not 0 <= self.subnet <= 255:
            raise InputError("subnet", self.subnet, "must be 0..255", "use the default")
        for index, _ in self.node_rates:
            if not 1 <= index <= self.nodes:
                raise InputError("--node_link", f"node{index}", "is not a node", "use node1..")

    def rate_of(self, index: int) -> int:
        """Bits/s of node ``index``'s link each way (0: unshaped)."""
        return dict(self.node_rates).get(index, self.rate_bps)

    @property
    def bridge_ns(self) -> str:
        return f"{self.prefix}-br"

    def node_ns(self, index: int) -> str:
        """Namespace of node ``index`` (1-based, like ``node1``)."""
        return f"{self.prefix}-node{index}"

    def node_addr(self, index: int) -> str:
        return f"10.250.{self.subnet}.{index}"

    @property
    def ctld_addr(self) -> str:
        return f"10.250.{self.subnet}.{CTLD_HOST}"

    @property
    def namespaces(self) -> list[str]:
        return [self.bridge_ns, *(self.node_ns(i) for i in range(1, self.nodes + 1))]

    def hosts_lines(self, names: Sequence[str]) -> list[str]:
        return [f"{self.node_addr(i)} {name}" for i, name in enumerate(names, start=1)]


def setup_commands(plan: LinkPlan) -> list[list[str]]:
    """Every ``ip``/``tc`` command that builds the plan, in order (namespaces first)."""
    br = plan.bridge_ns
    cmds = [["ip", "netns", "add", ns] for ns in plan.namespaces]
    cmds += [["ip", "-n", ns, "link", "set", "lo", "up"] for ns in plan.namespaces]
    cmds += [
        ["ip", "-n", br, "link", "add", BRIDGE, "type", "bridge"],
        ["ip", "-n", br, "addr", "add", f"{plan.ctld_addr}/24", "dev", BRIDGE],
        ["ip", "-n", br, "link", "set", BRIDGE, "up"],
    ]
    for i in range(1, plan.nodes + 1):
        ns, port = plan.node_ns(i), f"node{i}"
        cmds += [
            # Created inside the bridge namespace with its peer placed straight into the
            # node's: no interface ever appears in the host's namespace.
            ["ip", "-n", br, "link", "add", port, *_veth_peer(ns)],
            ["ip", "-n", br, "link", "set", port, "master", BRIDGE],
            ["ip", "-n", br, "link", "set", port, "up"],
            ["ip", "-n", ns, "addr", "add", f"{plan.node_addr(i)}/24", "dev", NODE_IF],
            ["ip", "-n", ns, "link", "set", NODE_IF, "up"],
        ]
    for i in range(1, plan.nodes + 1):
        if plan.rate_of(i):
            cmds += node_shape_commands(plan, i, plan.rate_of(i))
    return cmds


def _veth_peer(netns: str) -> list[str]:
    return ["type", "veth", "peer", "name", NODE_IF, "netns", netns]


def shape_commands(plan: LinkPlan, bps: int) -> list[list[str]]:
    """Set every link of a running plan to ``bps`` each way (0: remove the caps)."""
    return [cmd for i in range(1, plan.nodes + 1) for cmd in node_shape_commands(plan, i, bps)]


def node_shape_commands(plan: LinkPlan, index: int, bps: int) -> list[list[str]]:
    """Set node ``index``'s link to ``bps`` both ways (0: remove its caps)."""
    ends = ((plan.node_ns(index), NODE_IF), (plan.bridge_ns, f"node{index}"))
    return [tc_shape(ns, dev, bps) if bps else tc_unshape(ns, dev) for ns, dev in ends]


def teardown_commands(namespaces: Sequence[str]) -> list[list[str]]:
    """Deleting a namespace deletes the veth ends and qdiscs inside it."""
    return [["ip", "netns", "delete", ns] for ns in namespaces]


def nsenter_prefix(netns: str) -> list[str]:
    """Run the rest of a command line in ``netns`` (``nsenter`` execs: same PID)."""
    return ["nsenter", f"--net={NETNS_DIR}/{netns}", "--"]


def render_client_shim(real: str, bridge_ns: str, prefix: str) -> str:
    """A Slurm client wrapper: from the host it runs in the bridge namespace (where the
    controller is reachable); inside a node (a job's ``srun``, ``scontrol``) it runs as is."""
    return (
        "#!/bin/sh\n"
        "# slurmtf sandbox with links: reach slurmctld through the bridge namespace.\n"
        f'case "$(ip netns identify $$ 2>/dev/null)" in\n'
        f'  {prefix}-*) exec {real} "$@" ;;\n'
        f'  *) exec nsenter --net={NETNS_DIR}/{bridge_ns} -- {real} "$@" ;;\n'
        "esac\n"
    )


# ---- effects ---------------------------------------------------------------------------
def _default_runner(cmd: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=30, check=False)


def existing(prefix: str, runner: Runner = _default_runner) -> list[str]:
    """Namespaces named ``<prefix>-*`` that exist now (leftovers of a crashed sandbox)."""
    done = runner(["ip", "netns", "list"])
    names = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(f"{prefix}-")]


def create(plan: LinkPlan, runner: Runner = _default_runner) -> None:
    run_all(setup_commands(plan), runner)


def reshape(plan: LinkPlan, bps: int, runner: Runner = _default_runner) -> None:
    """Change the cap of a running sandbox's links (0: none; removing no cap is fine)."""
    _run_shape(shape_commands(plan, bps), bps, runner)


def reshape_node(plan: LinkPlan, index: int, bps: int, runner: Runner = _default_runner) -> None:
    """Change one node's cap on a running sandbox (``slurmtf sandbox link node3 100mbit``)."""
    _run_shape(node_shape_commands(plan, index, bps), bps, runner)


def _run_shape(cmds: Sequence[Sequence[str]], bps: int, runner: Runner) -> None:
    for cmd in cmds:
        done = runner(cmd)
        if done.returncode != 0 and not (bps == 0 and "handle of zero" in done.stderr):
            raise LinkError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")


def run_all(cmds: Sequence[Sequence[str]], runner: Runner = _default_runner) -> None:
    for cmd in cmds:
        done = runner(cmd)
        if done.returncode != 0 and not (done.stderr + done.stdout).strip():
            # Seen once on a loaded machine: tc exited non-zero without a word; a second
            # try succeeded. Anything that says why it failed is not retried.
            time.sleep(0.2)
            done = runner(cmd)
        if done.returncode != 0:
            raise LinkError(
                f"{' '.join(cmd)} failed (exit {done.returncode}): "
                f"{(done.stderr + done.stdout).strip()}"
            )


def destroy(namespaces: Sequence[str], runner: Runner = _default_runner) -> list[str]:
    """Delete the namespaces; return error lines for any that would not go."""
    errors = []
    for cmd in teardown_commands(namespaces):
        done = runner(cmd)
        if done.returncode != 0 and "No such file" not in done.stderr:
            errors.append(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return errors


# ---- throughput probe --------------------------------------------------------------------
PROBE_PORT = 5999


def _sink(port: int, max_s: float) -> None:
    """Accept one connection, read until EOF, print received bytes and seconds."""
    with socket.create_server(("0.0.0.0", port), reuse_port=True) as srv:
        srv.settimeout(max_s)
        conn, _ = srv.accept()
        conn.settimeout(max_s)
        total, first = 0, 0.0
        with conn:
            while chunk := conn.recv(1 << 20):
                if not total:
                    first = time.monotonic()
                total += len(chunk)
        print(total, time.monotonic() - first)


def _source(addr: str, port: int, seconds: float, max_bytes: int) -> None:
    buf = b"\0" * (1 << 18)
    sent, end = 0, time.monotonic() + seconds
    with socket.create_connection((addr, port), timeout=seconds + 5) as conn:
        while time.monotonic() < end and sent < max_bytes:
            conn.sendall(buf)
            sent += len(buf)


def measure_tcp(
    src_ns: str, dst_ns: str, dst_addr: str, seconds: float = 2.0, max_bytes: int = 2 << 30
) -> float:
    """Bits/s of one TCP stream from ``src_ns`` to ``dst_ns`` (bounded in time and bytes)."""
    py = [sys.executable, "-m", "slurmtf.sandbox.links"]
    sink = subprocess.Popen(
        [*nsenter_prefix(dst_ns), *py, "sink", str(PROBE_PORT), str(seconds + 10)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for _ in range(100):  # the sink's interpreter takes a moment to listen
            src = subprocess.run(
                [*nsenter_prefix(src_ns), *py, "source", dst_addr, str(PROBE_PORT),
                 str(seconds), str(max_bytes)],
                capture_output=True, text=True, timeout=seconds + 30, check=False,
            )  # fmt: skip
            if src.returncode == 0 or "refused" not in src.stderr:
                break
            time.sleep(0.1)
        out, err = sink.communicate(timeout=seconds + 15)
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait()
    if src.returncode != 0 or sink.returncode != 0:
        raise LinkError(f"throughput probe failed: {src.stderr.strip()} {err.strip()}")
    received, took = out.split()
    return int(received) * 8 / max(float(took), 1e-6)


if __name__ == "__main__":
    if sys.argv[1] == "sink":
        _sink(int(sys.argv[2]), float(sys.argv[3]))
    else:
        _source(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
