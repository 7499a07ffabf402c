"""Start and stop the sandbox's daemons by PID, and find what they left behind.

Daemons run in the foreground (``-D``/``-F``) as children started in a new session,
so the PID we record is the daemon itself. slurmctld and slurmd run inside a
private mount namespace whose /etc/hosts maps the node names to loopback; job
processes inherit it, which is also how leftovers are found at shutdown.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

# Bind the private hosts file over /etc/hosts, then become the daemon (same PID).
_NS_WRAPPER = 'mount --bind "$0" /etc/hosts && exec "$@"'


def start(
    argv: Sequence[str],
    log: Path,
    env: Mapping[str, str],
    hosts: Path | None = None,
    netns: str | None = None,
) -> int:
    """Start one foreground daemon detached from us; return its PID.

    With ``hosts``, the daemon runs in a new mount namespace where that file is
    /etc/hosts (``unshare`` and ``sh`` exec into it, so the PID is the daemon's).
    With ``netns``, it runs in that named network namespace (``nsenter`` execs too).
    """
    cmd = list(argv)
    if hosts is not None:
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _NS_WRAPPER,
               str(hosts), *cmd]  # fmt: skip
    if netns is not None:
        cmd = ["nsenter", f"--net=/run/netns/{netns}", "--", *cmd]
    # posix_spawn, not Popen: the daemon outlives us and nobody waits on a Popen object.
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        pid = os.posix_spawnp(
            cmd[0],
            cmd,
            dict(env),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fd, 1),
                (os.POSIX_SPAWN_DUP2, fd, 2),
                (os.POSIX_SPAWN_CLOSE, fd),
            ],
            setsid=True,
        )
    finally:
        os.close(fd)
    # The vfork-style spawn returns while exec still sets up the new image, when
    # /proc/PID/cmdline reads empty; wait for it so PID checks see the real argv.
    deadline = time.monotonic() + 2.0
    while not cmdline(pid) and not is_zombie(pid) and time.monotonic() < deadline:
        time.sleep(0.005)
    return pid


def cmdline(pid: int) -> str:
    """The process's command line with spaces between arguments ('' if gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def program(pid: int) -> str:
    """The name of the program the process runs (``slurmd`` for /opt/slurm-X/sbin/slurmd)."""
    words = cmdline(pid).split()
    return Path(words[0]).name if words else ""


def is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in {"Z", "X"}


def alive(pid: int, marker: str) -> bool:
    """True if ``pid`` runs and its command line contains ``marker`` (guards PID reuse).

    A process in the middle of an exec (``unshare`` -> ``sh`` -> daemon) briefly shows
    an empty command line; look again before calling it gone.
    """
    for _ in range(20):
        line = cmdline(pid)
        if line or is_zombie(pid):
            return marker in line
        time.sleep(0.01)
    return False


def reap(pid: int) -> None:
    """Collect an exited child of ours, if it is one (no-op otherwise)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def mount_ns(pid: int) -> str:
    try:
        return str(Path(f"/proc/{pid}/ns/mnt").readlink())
    except OSError:
        return ""


def pids_in_namespaces(
    namespaces: Iterable[str], exclude: Iterable[int] = (), marker: str = ""
) -> list[int]:
    """Every live process whose mount namespace is one of ``namespaces``; with ``marker``
    (a sandbox's directory), none of a namespace that holds another sandbox's daemon: a
    recorded namespace whose daemons are gone frees its number, which the kernel gives to
    the next namespace made, perhaps another sandbox's."""
    wanted = {ns for ns in namespaces if ns}
    own = mount_ns(os.getpid())
    wanted.discard(own)  # never the host's namespace
    skip = set(exclude) | {os.getpid()}
    by_namespace: dict[str, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        pid = int(entry.name)
        ns = mount_ns(pid)
        if ns in wanted and not is_zombie(pid):
            by_namespace.setdefault(ns, []).append(pid)
    return sorted(
        pid
        for pids in by_namespace.values()
        if not (marker and any(foreign_daemon(cmdline(p), marker) for p in pids))
        for pid in pids
    )


def foreign_daemon(command: str, marker: str) -> bool:
    """Whether ``command`` is a sandbox daemon (its ``slurm.conf`` or munge key) of a
    sandbox other than the one in ``marker``."""
    daemon = "/slurm.conf" in command or "munge.key" in command
    return daemon and f"{marker.rstrip('/')}/" not in command


def signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def stop(pids: Mapping[int, str], timeout: float = 10.0) -> list[int]:
    """SIGTERM every live PID at once, wait, then SIGKILL the rest.

    ``pids`` maps a PID to the marker its command line must contain, so a reused
    PID belonging to someone else is never signalled. Returns PIDs that had to be
    killed.
    """
    live = {pid for pid, marker in pids.items() if alive(pid, marker)}
    signal_all(live, signal.SIGTERM)
    killed = []
    deadline = time.monotonic() + timeout
    while live and time.monotonic() < deadline:
        for pid in list(live):
            reap(pid)
            if not alive(pid, pids[pid]):
                live.discard(pid)
        if live:
            time.sleep(0.1)
    for pid in live:
        killed.append(pid)
        signal_all([pid], signal.SIGKILL)
        reap(pid)
    return killed


def kill_and_wait(pids: Sequence[int], timeout: float = 5.0) -> None:
    """SIGKILL ``pids`` (already checked to be ours) and wait until they are gone."""
    signal_all(pids, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        for pid in left:
            reap(pid)
        left = [pid for pid in left if not is_zombie(pid)]
        if left:
            time.sleep(0.05)


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])
