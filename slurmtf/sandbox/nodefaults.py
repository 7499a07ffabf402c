"""Break one node of a running sandbox the ways real nodes break, and mend it again.

* :func:`kill_node`: the node dies: its ``slurmd`` and every process of its jobs get
  SIGKILL (slurmctld only notices at ``SlurmdTimeout``, as with a real crash).
* :func:`freeze_node`: the node hangs: ``slurmd``, ``slurmstepd`` and the tasks all get
  SIGSTOP; :func:`thaw_node` sends SIGCONT.
* :func:`restart_node`: a fresh ``slurmd`` for the node (``ReturnToService=2`` brings
  the node back once it registers).

A node's processes are found through ``/proc``: this sandbox's ``slurmd -N NODE``, the
processes whose environment has ``SLURMD_NODENAME=NODE`` and this sandbox's
``SLURM_CONF``, and the ``slurmstepd`` that started them. Only those PIDs are signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
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


def node_pids(sandbox: Sandbox, node: str) -> list[int]:
    """``slurmd`` first, then the step daemons and job processes running on ``node``."""
    conf = str(sandbox.config().conf_path).encode()
    slurmd = sandbox.live_daemons().get(f"slurmd-{node}")
    found: list[int] = [slurmd] if slurmd else []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        env = _environ(int(entry.name))
        if env.get(b"SLURMD_NODENAME") == node.encode() and env.get(b"SLURM_CONF") == conf:
            pid = int(entry.name)
            found.append(pid)
            parent = _parent(pid)
            if parent and daemons.cmdline(parent).startswith("slurmstepd"):
                found.append(parent)
    return list(dict.fromkeys(found))


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
        ["slurmd", "-D", "-f", str(cfg.conf_path), "-N", node],
        cfg.dir / "log" / f"slurmd-{node}.out",
        env,
        cfg.dir / "hosts",
        plan.node_ns(index) if plan else None,
    )
    sandbox.record_pid(f"slurmd-{node}", pid)
    return pid
