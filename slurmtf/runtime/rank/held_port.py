"""A rank's port held by another process: found before TensorFlow binds it, told as a
``port_in_use`` event (port, node, the holder where it can be read) and read back by
:mod:`slurmtf.runtime.recovery.decision` as a failure of the node's state, not of the rank.

The holder comes from Linux's socket tables (``/proc/net/tcp``, ``/proc/net/tcp6``: the
socket's inode) and the processes' file descriptors (``/proc/PID/fd``: which process has
that socket open), read within :data:`SCAN_LIMIT_S`; a process of another user is not
readable without root, and then the event says only that another process holds the port.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmtf import events
from slurmtf.cluster.layout import ClusterLayout
from slurmtf.cluster.ports import PortInUseError, ensure_port_free

EVENT = "port_in_use"
SCAN_LIMIT_S = 2.0
_TIME_WAIT = "06"
_SLURM_NAMES = ("SLURM_JOB_ID", "SLURM_PROCID", "SLURMD_NODENAME")


class PortHeldError(PortInUseError):
    """This rank's port is held by another process (the ``port_in_use`` event says which)."""


@dataclass(frozen=True)
class Holder:
    """A process that has a socket on the port open, and its Slurm task when it is one."""

    pid: int
    command: str
    slurm: Mapping[str, str]

    def describe(self) -> str:
        """``pid 4242 (python3 -m models.mnist; job 77 rank 1 on node2)``."""
        task = ""
        if self.slurm.get("SLURM_JOB_ID"):
            task = f"; job {self.slurm['SLURM_JOB_ID']}"
            if self.slurm.get("SLURM_PROCID"):
                task += f" rank {self.slurm['SLURM_PROCID']}"
            if self.slurm.get("SLURMD_NODENAME"):
                task += f" on {self.slurm['SLURMD_NODENAME']}"
        command = " ".join(self.command.split())  # one line, whatever its arguments hold
        return f"pid {self.pid} ({command[:120]}{task})"


def check_port(layout: ClusterLayout, proc: Path = Path("/proc")) -> None:
    """Raise :class:`PortHeldError` (after the ``port_in_use`` event) when this rank's
    port cannot be bound; nothing for a single worker (it opens no port)."""
    if layout.is_single_worker:
        return
    try:
        ensure_port_free(layout.port)
    except PortInUseError as exc:
        holder = holder_of(layout.port, proc)
        events.emit(EVENT, **held_fields(layout, holder))
        raise PortHeldError(held_message(layout, holder, str(exc))) from exc


def recheck_port(layout: ClusterLayout, proc: Path = Path("/proc")) -> None:
    """After TensorFlow failed to start this rank's server: when another process took the
    port since :func:`check_port` (TensorFlow loads for seconds in between), the same
    event and error; nothing when the port is free or this process holds it."""
    if layout.is_single_worker:
        return
    inodes = socket_inodes(layout.port, proc)
    if not inodes or _has_socket(proc / str(os.getpid()), inodes):
        return
    holder = holder_of(layout.port, proc)
    events.emit(EVENT, **held_fields(layout, holder))
    raise PortHeldError(
        held_message(layout, holder, f"port {layout.port} was taken while TensorFlow loaded")
    )


def held_fields(layout: ClusterLayout, holder: Holder | None) -> dict[str, Any]:
    """The ``port_in_use`` event's fields (see :func:`describe_held`)."""
    return {
        "rank": layout.task_index,
        "port": layout.port,
        "node": layout.node,
        "holder": holder.describe() if holder else None,
        "holder_pid": holder.pid if holder else None,
        "source": layout.port_source,
        "moves": layout.port_moves,
        "rule": layout.port_rule,
        "restart_count": layout.restart_count,
    }


def held_message(layout: ClusterLayout, holder: Holder | None, cause: str) -> str:
    """The rank's one line: the port, the node, the holder; what a restart does."""
    found = cause.partition(": another")[0]  # port HOST:PORT is already in use (...)
    who = holder.describe() if holder else "another process"
    what = (
        f"rank {layout.task_index}'s port {layout.port} on {layout.node} is held by {who}: {found}"
    )
    if layout.port_moves:
        return (
            f"{what}. HINT: slurmtf's job scripts and slurmtf submit restart the step in "
            "place on other ports (MAX_RESTARTS); run by hand, start it again or stop that "
            "process"
        )
    return f"{what}. {fixed_hint(layout.port_rule)}"


def fixed_hint(rule: str) -> str:
    """What to do about a held port of a base the user fixed."""
    return (
        f"The ports are {rule}, so slurmtf does not move them. HINT: pick another free base, "
        "or unset SLURMTF_PORT_BASE/--port_base to let slurmtf choose ports per job and "
        "attempt, or stop that process"
    )


def describe_held(event: Mapping[str, Any]) -> tuple[str, bool]:
    """A ``port_in_use`` event in words for the job's log, and whether a restart (on other
    ports) may help: not when the user fixed the base."""
    holder = " ".join(str(event.get("holder") or "another process").split())
    port, node = event.get("port"), event.get("node")
    what = f"rank {event.get('rank')}'s port {port} on {node} was held by {holder}"
    if event.get("moves", True):
        return (
            f"{what} (the node's state, not the rank's error: the next attempt takes other ports)",
            True,
        )
    return f"{what}. {fixed_hint(str(event.get('rule', 'fixed')))}", False


def holder_of(port: int, proc: Path = Path("/proc")) -> Holder | None:
    """The process with a socket bound to ``port`` open, when this user can read it."""
    inodes = socket_inodes(port, proc)
    if not inodes:
        return None
    deadline = time.monotonic() + SCAN_LIMIT_S
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        if time.monotonic() > deadline:
            return None
        if _has_socket(pid_dir, inodes):
            return Holder(int(pid_dir.name), _command(pid_dir), _slurm_vars(pid_dir))
    return None


def socket_inodes(port: int, proc: Path = Path("/proc")) -> set[str]:
    """The inodes of the TCP sockets (IPv4 and IPv6) whose local port is ``port``."""
    found = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] == _TIME_WAIT or fields[9] == "0":
                continue
            if int(fields[1].rpartition(":")[2], 16) == port:
                found.add(fields[9])
    return found


def _has_socket(pid_dir: Path, inodes: set[str]) -> bool:
    try:
        for fd in (pid_dir / "fd").iterdir():
            link = str(fd.readlink())
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return True
    except OSError:  # gone, or another user's
        return False
    return False


def _command(pid_dir: Path) -> str:
    try:
        raw = (pid_dir / "cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part) or "?"


def _slurm_vars(pid_dir: Path) -> dict[str, str]:
    try:
        raw = (pid_dir / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0"))
    return {k: v for k, _, v in pairs if k in _SLURM_NAMES}
