"""Worker ports: the documented scheme (pure), a check that a port is free and free ports
for a step on this machine (edge).

Scheme (see docs/RESOLVER.md, "Ports"): every rank of a step has its own port, even when
all ranks share one network stack, and a restart never gives a rank a port an earlier
attempt of the job used. In order:

* ``SLURMTF_PORT_BASE`` / ``--port_base`` when given: rank ``r`` on ``base + r``
  (1024..65535, ``base + ntasks - 1`` must stay <= 65535); fixed, never moved;
* ``SLURM_STEP_RESV_PORTS`` (``MpiParams=ports=LOW-HIGH`` and ``srun --resv-ports``):
  Slurm reserves the same ports on every node of the step, unique on each node among the
  steps that reserved ports. With one port per rank, rank ``r`` takes the ``r``-th; with
  fewer (Slurm's own count: the most tasks of a node plus one) a rank takes the port at
  its local id, so the ranks of a node differ. ``SLURMTF_RESV_PORTS=0`` ignores them;
* inside Slurm: ``12000 + (key % 200) * 100`` where ``key`` is ``SLURM_HET_JOB_ID`` (a
  heterogeneous job) or ``SLURM_JOB_ID`` (unique per array element), moved by the attempt
  (``SLURM_RESTART_COUNT``: restarts in place + requeues) inside the job's slot of 100
  ports. Jobs of up to 100 tasks whose ids differ by less than 200 never share a port;
  bigger jobs keep the same rule with fewer slots so that the ports stay inside
  12000..31999, below Linux's ephemeral range; a job with more than 20,000 tasks uses the
  top of the port range;
* outside Slurm (or without a job id): :data:`DEFAULT_PORT`.
"""

from __future__ import annotations

import errno
import random
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

from slurmtf.cluster.env import SlurmEnv
from slurmtf.cluster.placement import count
from slurmtf.cluster.port_claims import CLAIM_S, Claim, held_claims
from slurmtf.errors import InputError, SlurmtfError

PORT_MIN = 1024
PORT_MAX = 65535
WINDOW_LOW = 12000
WINDOW_HIGH = 32000  # exclusive; Linux hands out ephemeral ports from 32768
SLOT_SIZE = 100
DEFAULT_PORT = 11000
# A step on this machine (slurmtf.local.step, benchmarks, tests) takes its ports here: above
# Linux's ephemeral range (32768-60999) and the per-job window, so that they never meet a
# sandbox job's or a client socket's.
LOCAL_PORT_RANGE = (61000, 65000)

_OVERRIDE_HINT = "set SLURMTF_PORT_BASE (or --port_base) to a free base between 1024 and 65535"
RESV_VAR = "SLURM_STEP_RESV_PORTS"
RESV_MODE_VAR = "SLURMTF_RESV_PORTS"
_RESV_HINT = (
    "let srun reserve one port per rank (srun --resv-ports=NTASKS; the job scripts and "
    "slurmtf submit ask it), or set SLURMTF_RESV_PORTS=0 to use slurmtf's own ports"
)
_MODES = {"": None, "auto": None, "1": True, "on": True, "yes": True, "true": True,
          "0": False, "off": False, "no": False, "false": False}  # fmt: skip
# The attempts a firewall rule covers for a job whose restarts leave its slot (> 50 ranks).
COVERED_ATTEMPTS = 8


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


def attempt_base(base: int, ntasks: int, attempt: int) -> int:
    """Attempt ``attempt``'s base of a job whose first attempt starts at ``base``.

    The first ``100 // ntasks`` attempts stay in the job's slot of :data:`SLOT_SIZE`
    ports, each ``ntasks`` further on (jobs near it never meet them); the attempts after
    those take, one after another, the blocks of ``ntasks`` ports of the window
    12000..31999 that do not touch the slot's (its neighbours' slots). So no two attempts
    share a port until the window has been gone through (a 2-rank job: 10,000 attempts).
    """
    span = WINDOW_HIGH - WINDOW_LOW
    if attempt <= 0 or base < WINDOW_LOW or base + ntasks > WINDOW_HIGH:
        return base
    sets = max(SLOT_SIZE // ntasks, 1)  # the attempts inside the slot, the first included
    if attempt < sets:
        return base + attempt * ntasks
    blocks = span // ntasks
    after = -(-(base + sets * ntasks - WINDOW_LOW) // ntasks)  # first block past the slot's
    before = (base - WINDOW_LOW) // ntasks  # blocks that end at or before the base
    free = max(blocks - after, 0) + before
    if free == 0:
        return base + (attempt % sets) * ntasks
    index = (attempt - sets) % free
    block = after + index if index < blocks - after else index - (blocks - after)
    return WINDOW_LOW + block * ntasks


def job_port_spans(
    key: int, ntasks: int, attempts: int = COVERED_ATTEMPTS
) -> list[tuple[int, int]]:
    """The ports (first, last) a step of ``ntasks`` ranks of job ``key`` listens on in its
    first ``attempts`` attempts, and every attempt inside its slot."""
    base = derive_port_base(key, ntasks)
    count = max(attempts, SLOT_SIZE // ntasks)
    firsts = {attempt_base(base, ntasks, a) for a in range(count)}
    return [(first, first + ntasks - 1) for first in sorted(firsts)]


def parse_resv_mode(value: str | None, name: str = RESV_MODE_VAR) -> bool | None:
    """``SLURMTF_RESV_PORTS``: ``1``/``on`` (ask srun for reserved ports and use them),
    ``0``/``off`` (neither), ``auto`` or unset (``None``: ask when the cluster has
    ``MpiParams=ports``; use them when a step has them)."""
    text = (value or "").strip().lower()
    if text not in _MODES:
        raise InputError(name, value, "is not auto, 1 or 0", f"{name}=0 ignores Slurm's "
                         "reserved ports, 1 asks srun for them, auto (the default) follows "
                         "the cluster's MpiParams=ports")  # fmt: skip
    return _MODES[text]


def parse_reserved_ports(value: str, name: str = RESV_VAR) -> tuple[int, ...]:
    """Slurm's reserved ports of a step, as it writes them (a hostlist of numbers without
    brackets, sorted): ``12000-12003``, ``12000,12005-12007``; brackets are accepted."""
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    found: list[int] = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not _is_port(low) or (dash and not _is_port(high)):
            raise InputError(name, value, f"has {part.strip()!r}, not a port or LOW-HIGH",
                             _RESV_HINT)  # fmt: skip
        first, last = int(low), int(high if dash else low)
        if last < first:
            raise InputError(name, value, f"has the reversed range {part.strip()!r}", _RESV_HINT)
        if len(found) + last - first >= PORT_MAX:
            raise InputError(name, value, f"lists more than {PORT_MAX} ports", _RESV_HINT)
        found.extend(range(first, last + 1))
    if len(set(found)) != len(found):
        raise InputError(name, value, "lists a port twice", _RESV_HINT)
    return tuple(found)


def _is_port(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 5 and 1 <= int(text) <= PORT_MAX


@dataclass(frozen=True)
class PortPlan:
    """Every rank's port, where they come from (``fixed``, ``reserved``, ``job``,
    ``default``) and the rule in words (``--explain``, the ``cluster`` event)."""

    ports: tuple[int, ...]
    source: str
    rule: str


def plan_ports(
    local_ids: Sequence[int],
    *,
    key: int | None,
    attempt: int = 0,
    fixed: int | None = None,
    fixed_name: str = "SLURMTF_PORT_BASE",
    reserved: str | None = None,
    ntasks_name: str = "SLURM_STEP_NUM_TASKS",
) -> PortPlan:
    """The ports of a step whose rank ``r`` has ``local_ids[r]`` on its node (see the
    module's docstring for the order of the rules)."""
    ntasks = len(local_ids)
    if fixed is not None:
        check_port_range(fixed, ntasks, fixed_name)
        rule = f"{fixed} + rank ({fixed_name}={fixed}: fixed, the same on every attempt)"
        return PortPlan(tuple(range(fixed, fixed + ntasks)), "fixed", rule)
    if reserved is not None:
        return _reserved_plan(parse_reserved_ports(reserved), reserved, local_ids)
    first = derive_port_base(key, ntasks, ntasks_name)
    if key is None:
        rule = f"{first} + rank (no job id: slurmtf's default)"
        return PortPlan(tuple(range(first, first + ntasks)), "default", rule)
    base = attempt_base(first, ntasks, attempt)
    rule = f"{base} + rank (job {key}: base {first}; attempt {attempt}: +{base - first})"
    return PortPlan(tuple(range(base, base + ntasks)), "job", rule)


def step_ports(
    env: SlurmEnv,
    local_ids: Sequence[int],
    *,
    fixed: int | None,
    fixed_name: str,
    het: bool = False,
) -> PortPlan:
    """:func:`plan_ports` for the step ``env`` describes: its job id, its attempt, its
    reserved ports (not those of a heterogeneous step: each component has its own, and a
    rank knows only its own component's)."""
    use = parse_resv_mode(env.resv_mode) is not False and not het
    return plan_ports(
        local_ids,
        key=port_key(env),
        attempt=count(env.restart_count, "SLURM_RESTART_COUNT"),
        fixed=fixed,
        fixed_name=fixed_name,
        reserved=env.resv_ports if use and env.resv_ports else None,
        ntasks_name=env.num_tasks_var,
    )


def port_key(env: SlurmEnv) -> int | None:
    """The job's port key: the het job id for heterogeneous jobs, else the job id."""
    hint = "unset it, or set SLURMTF_PORT_BASE to choose ports yourself"
    if env.het_job_id is not None:
        return count(env.het_job_id, "SLURM_HET_JOB_ID", hint)
    if env.het_job_ids and env.het_job_ids[0] is not None:  # the same id in every component
        return count(env.het_job_ids[0], "SLURM_JOB_ID_HET_GROUP_0", hint)
    if env.job_id is not None:
        return count(env.job_id, "SLURM_JOB_ID", hint)
    return None


def _reserved_plan(found: tuple[int, ...], text: str, local_ids: Sequence[int]) -> PortPlan:
    """Rank ``r`` on the ``r``-th reserved port when there is one per rank, else on the one
    at its local id (Slurm reserved them on every node of the step)."""
    where = f"{RESV_VAR}={text}"
    if len(found) >= len(local_ids):
        return PortPlan(found[: len(local_ids)], "reserved", f"port number rank of {where}")
    most = max(local_ids) + 1
    if len(found) < most:
        raise InputError(
            RESV_VAR, text, f"lists {len(found)} port(s), fewer than the {most} tasks of a node",
            _RESV_HINT,
        )  # fmt: skip
    ports = tuple(found[i] for i in local_ids)
    return PortPlan(ports, "reserved", f"port number local id of {where} (per node)")


def port_free(port: int, host: str = "") -> bool:
    """True when ``host:port`` (IPv4; all addresses by default) can be bound right now, as
    a server that sets ``SO_REUSEADDR`` (gRPC, slurmd) binds it."""
    try:
        _try_bind(socket.AF_INET, host, port)
    except PortInUseError:
        return False
    return True


def ports_free(base: int, count: int, host: str = "") -> bool:
    """True when ``count`` consecutive ports from ``base`` can all be bound right now."""
    return all(port_free(base + i, host) for i in range(count))


def free_port_base(
    count: int, low: int = LOCAL_PORT_RANGE[0], high: int = LOCAL_PORT_RANGE[1]
) -> int:
    """A base port with ``count`` consecutive ports free right now, at a random place,
    and claimed for an hour (:mod:`slurmtf.cluster.port_claims`): steps, tests and
    benchmarks started at once on one machine, in any process, never get the same ports.
    When claims fill the range, a base free right now is enough.
    """
    rng = random.Random()
    with held_claims() as claims:
        for attempt in range(400):
            base = rng.randrange(low, high - count)
            if attempt < 200 and any(claim.overlaps(base, count) for claim in claims):
                continue
            if ports_free(base, count):
                claims.append(Claim(base, count, time.time() + CLAIM_S))
                return base
    raise RuntimeError(f"no {count} consecutive free ports in [{low}, {high})")


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
