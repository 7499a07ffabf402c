"""Break one node of a running sandbox the ways real nodes break, and mend it again.

* :func:`kill_node`: the node dies: its ``slurmd`` and every process of its jobs get
  SIGKILL (slurmctld only notices at ``SlurmdTimeout``, as with a real crash).
* :func:`freeze_node`: the node hangs: ``slurmd``, ``slurmstepd`` and the tasks all get
  SIGSTOP; :func:`thaw_node` sends SIGCONT.
* :func:`restart_node`: a fresh ``slurmd`` for the node (``ReturnToService=2`` brings
  the node back once it registers).

A node's processes are found through ``/proc``: this sandbox's ``slurmd -N NODE``, the
processes whose environment has ``SLURMD_NODENAME=NODE`` and this sandbox's
``SLURM_CONF``, the ``slurmstepd`` that started them, and everything else those step
daemons started (:func:`node_members`). Only those PIDs are signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from slurmtf.sandbox import daemons
from slurmtf.sandbox.core import Sandbox


def _environ(pid: int) -> dict[bytes, bytes]:
    try:
        items = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(item.split(b"=", 1) for item in items if b"=" in item)


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


@dataclass(frozen=True)
class Proc:
    """What tells a process's node: its parent, command line and two environment values."""

    ppid: int
    cmdline: str
    node: bytes = b""  # SLURMD_NODENAME
    conf: bytes = b""  # SLURM_CONF


def processes() -> dict[int, Proc]:
    """Every process of this machine (but this one), read from /proc."""
    found: dict[int, Proc] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        env = _environ(pid)
        found[pid] = Proc(
            _parent(pid), daemons.cmdline(pid), env.get(b"SLURMD_NODENAME", b""),
            env.get(b"SLURM_CONF", b""),
        )  # fmt: skip
    return found


def node_members(procs: dict[int, Proc], node: str, conf: str, slurmd: int = 0) -> list[int]:
    """The node's processes: ``slurmd`` first, then every task of this sandbox (``conf``)
    with ``SLURMD_NODENAME=node`` and the ``slurmstepd`` that started it, then whatever
    those step daemons started that carries no such variable (a task that cleared its
    environment); each once."""
    found: list[int] = [slurmd] if slurmd else []
    steps: set[int] = set()
    for pid, proc in procs.items():
        if proc.node == node.encode() and proc.conf == conf.encode():
            found.append(pid)
            parent = procs.get(proc.ppid)
            if parent is not None and parent.cmdline.startswith("slurmstepd"):
                found.append(proc.ppid)
                steps.add(proc.ppid)
    found += [pid for pid in procs if _descends(procs, pid, steps)]
    return list(dict.fromkeys(found))


def _descends(procs: dict[int, Proc], pid: int, roots: set[int]) -> bool:
    seen = 0
    while pid in procs and seen < 64:  # bounded: a parent chain is short
        pid, seen = procs[pid].ppid, seen + 1
        if pid in roots:
            return True
    return False


def node_pids(sandbox: Sandbox, node: str) -> list[int]:
    """``slurmd`` first, then the step daemons and job processes running on ``node``."""
    conf = str(sandbox.config().conf_path)
    slurmd = sandbox.live_daemons().get(f"slurmd-{node}") or 0
    return node_members(processes(), node, conf, slurmd)


def _signal(pids: list[int], signum: signal.Signals) -> list[int]:
    hit = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
            hit.append(pid)
    return hit


def kill_pids(pids: list[int]) -> list[int]:
    """SIGCONT and SIGKILL these PIDs (stopped ones included); the PIDs still there."""
    _signal(pids, signal.SIGCONT)
    return _signal(pids, signal.SIGKILL)


def kill_node(sandbox: Sandbox, node: str) -> list[int]:
    """SIGKILL the node's ``slurmd`` and everything of its jobs; the PIDs signalled."""
    pids = node_pids(sandbox, node)
    # Stop first, so that no process of the node reacts to the others dying.
    _signal(pids, signal.SIGSTOP)
    return _signal(pids, signal.SIGKILL)


def freeze_node(sandbox: Sandbox, node: str) -> list[int]:
    """SIGSTOP every process of the node (a hung node); the PIDs stopped."""
    return _signal(node_pids(sandbox, node), signal.SIGSTOP)


def thaw_node(pids: list[int]) -> None:
    """SIGCONT the processes :func:`freeze_node` stopped."""
    _signal(pids, signal.SIGCONT)


def restart_node(sandbox: Sandbox, node: str) -> int:
    """Start a new ``slurmd`` for ``node`` (after :func:`kill_node`); its PID."""
    cfg = sandbox.config()
    old = sandbox.live_daemons().get(f"slurmd-{node}")
    if old:
        return old
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env["SLURM_CONF"] = str(cfg.conf_path)
    plan = cfg.link_plan
    index = cfg.node_names.index(node) + 1
    pid = daemons.start(
        [cfg.daemon("slurmd"), "-D", "-f", str(cfg.conf_path), "-N", node],
        cfg.dir / "log" / f"slurmd-{node}.out",
        env,
        cfg.dir / "hosts",
        plan.node_ns(index) if plan else None,
    )
    sandbox.record_pid(f"slurmd-{node}", pid)
    return pid


IN_SERVICE = frozenset({"idle", "mixed", "allocated"})  # node states that take jobs


def mend(
    sandbox: Sandbox, stopped: list[int], timeout: float, states: frozenset[str] = IN_SERVICE
) -> bool:
    """After a node failure: thaw the ``stopped`` PIDs, kill the job processes among them
    (they belong to an attempt Slurm has given up on), start the slurmd of every node that
    lost it, and resume down or drained nodes until each is in one of ``states``.
    False if that took longer than ``timeout`` seconds."""
    thaw_node(stopped)
    kill_pids([p for p in stopped if daemons.program(p) != "slurmd"])
    for node in sandbox.config().node_names:
        restart_node(sandbox, node)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = sandbox.node_states()
        if now and all(state in states for state in now.values()):
            return True
        for node, state in now.items():
            if "down" in state or "drain" in state:
                sandbox.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
        time.sleep(1)
    return False
