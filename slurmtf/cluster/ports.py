"""Worker ports: the documented scheme (pure) and a check that a port is free (edge).

Scheme (see docs/RESOLVER.md): rank ``r`` of a job listens on ``base + r``, so every
rank of a job has its own port even when all ranks share one network stack. The base is

* ``SLURMTF_PORT_BASE`` / ``--port_base`` when given (1024..65535, ``base + ntasks - 1``
  must stay <= 65535);
* inside Slurm: ``12000 + (key % 200) * 100`` where ``key`` is ``SLURM_HET_JOB_ID`` (a
  heterogeneous job) or ``SLURM_JOB_ID`` (unique per array element). Jobs of up to 100
  tasks whose ids differ by less than 200 never share a port; bigger jobs keep the same
  rule with fewer slots so that the ports stay inside 12000..31999, below Linux's
  ephemeral range; a job with more than 20,000 tasks uses the top of the port range;
* outside Slurm (or without a job id): :data:`DEFAULT_PORT`.
"""

from __future__ import annotations

import errno
import socket

from slurmtf.errors import InputError, SlurmtfError

PORT_MIN = 1024
PORT_MAX = 65535
WINDOW_LOW = 12000
WINDOW_HIGH = 32000  # exclusive; Linux hands out ephemeral ports from 32768
SLOT_SIZE = 100
DEFAULT_PORT = 11000

_OVERRIDE_HINT = "set SLURMTF_PORT_BASE (or --port_base) to a free base between 1024 and 65535"


class PortInUseError(SlurmtfError, OSError):
    """The port chosen for this task is held by another process."""


def parse_port_base(value: str | int, name: str = "SLURMTF_PORT_BASE") -> int:
    """Validate an explicit base port (range only; see :func:`check_port_range`)."""
    text = str(value).strip()
    if not text.isascii() or not text.isdigit():
        raise InputError(name, value, "is not a port number", _OVERRIDE_HINT)
    base = int(text)
    if not PORT_MIN <= base <= PORT_MAX:
        raise InputError(name, value, f"is outside {PORT_MIN}..{PORT_MAX}", _OVERRIDE_HINT)
    return base


def check_port_range(base: int, ntasks: int, name: str = "SLURMTF_PORT_BASE") -> None:
    """Raise when ``base + ntasks - 1`` does not fit below 65536."""
    if base + ntasks - 1 > PORT_MAX:
        raise InputError(
            name,
            base,
            f"leaves no room for {ntasks} ranks (ports {base}..{base + ntasks - 1})",
            f"use a base of at most {PORT_MAX + 1 - ntasks}",
        )


def derive_port_base(key: int | None, ntasks: int, name: str = "SLURM_STEP_NUM_TASKS") -> int:
    """The base port of a job: a pure function of its key (job id) and size."""
    if ntasks > PORT_MAX + 1 - PORT_MIN:
        raise InputError(
            name,
            ntasks,
            f"exceeds the {PORT_MAX + 1 - PORT_MIN} distinct ports a node can offer",
            "run fewer tasks per step",
        )
    if key is None:
        return DEFAULT_PORT if DEFAULT_PORT + ntasks - 1 <= PORT_MAX else PORT_MAX + 1 - ntasks
    span = WINDOW_HIGH - WINDOW_LOW
    if ntasks > span:
        return PORT_MAX + 1 - ntasks
    slots = min((span - ntasks) // SLOT_SIZE + 1, span // SLOT_SIZE)
    return WINDOW_LOW + (key % slots) * SLOT_SIZE


def port_free(port: int, host: str = "") -> bool:
    """True when ``host:port`` (IPv4; all addresses by default) can be bound right now, as
    a server that sets ``SO_REUSEADDR`` (gRPC, slurmd) binds it."""
    try:
        _try_bind(socket.AF_INET, host, port)
    except PortInUseError:
        return False
    return True


def ensure_port_free(port: int, host: str = "") -> None:
    """Bind and release ``host:port`` (as gRPC will) to fail early and clearly if taken.

    With the default ``host`` the IPv6 wildcard is checked too where the machine has
    IPv6, since gRPC listens on ``[::]``.
    """
    _try_bind(socket.AF_INET, host, port)
    if not host and socket.has_ipv6:
        _try_bind(socket.AF_INET6, "::", port, missing_ok=True)


def _try_bind(family: socket.AddressFamily, host: str, port: int, missing_ok: bool = False) -> None:
    where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host or '0.0.0.0'}:{port}"
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((host, port))
    except OSError as exc:
        if exc.errno in {errno.EADDRINUSE, errno.EACCES}:
            raise PortInUseError(
                f"port {where} is already in use ({exc.strerror}): another job or process "
                f"holds it. HINT: {_OVERRIDE_HINT}, or stop the other process"
            ) from exc
        if missing_ok and exc.errno in {errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL}:
            return  # no IPv6 on this machine
        raise PortInUseError(
            f"cannot bind {where} ({exc.strerror}). HINT: {_OVERRIDE_HINT}"
        ) from exc
