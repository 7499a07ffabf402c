"""The per-job firewall's rules, pure: which ports a job's workers may use, who may
reach them, and the nftables text that says so.

One table per job (``inet slurmtf_job_<id>``), so jobs sharing a node never touch each
other's rules. Its ``input`` chain sends TCP packets for the job's ports to ``guard``,
which accepts loopback and the job's nodes and drops the rest; its ``output`` chain
drops connections to those ports from local sockets of other users (root excepted).
Ports come from :func:`slurmtf.cluster.ports.job_port_spans`, the resolver's own derivation.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from slurmtf.cluster import ports
from slurmtf.errors import InputError

TABLE_PREFIX = "slurmtf_job_"
FAMILY = "inet"
# Before the usual `filter` chains; a drop in any base chain is final, an accept is not.
PRIORITY = "filter - 10"
SETTINGS_NAME = "slurmtf-firewall.conf"
SETTINGS_KEYS = ("python", "port_base", "address_template", "log", "nft", "scontrol")

PortRange = tuple[int, int]  # first, last (inclusive)


@dataclass(frozen=True)
class JobRules:
    """What one job's table says: its ports, the addresses of its nodes, its user."""

    job_id: int
    ports: tuple[PortRange, ...]
    peers4: tuple[str, ...] = ()
    peers6: tuple[str, ...] = ()
    uid: int | None = None

    def __post_init__(self) -> None:
        hint = "build rules with slurmtf.firewall.rules.job_ports"
        if not self.ports:
            raise InputError("ports", self.ports, "is empty", hint)
        for first, last in self.ports:
            if not ports.PORT_MIN <= first <= last <= ports.PORT_MAX:
                raise InputError("ports", (first, last), "is not a port range", hint)

    @property
    def table(self) -> str:
        return table_name(self.job_id)


def table_name(job_id: int) -> str:
    """``slurmtf_job_<id>``: the name of a job's table."""
    return f"{TABLE_PREFIX}{job_id}"


def job_ports(key: int, max_tasks: int, port_base: int | None = None) -> tuple[PortRange, ...]:
    """Every port a step of up to ``max_tasks`` ranks of this job may listen on.

    ``key`` is the resolver's port key (the het job id, else the job id); with a
    cluster-wide ``port_base`` every job uses ``base .. base + tasks - 1``. Without one,
    the base of a step depends on its size and its attempt (a restart moves it), so this
    is the union over every size and the first :data:`ports.COVERED_ATTEMPTS` attempts.
    Slurm's reserved ports (``SLURM_STEP_RESV_PORTS``) are a step's, unknown to a job's
    prolog: they are not in the table.
    """
    if max_tasks < 1:
        raise InputError("max_tasks", max_tasks, "must be at least 1", "count the job's CPUs")
    if port_base is not None:
        last = min(port_base + max_tasks - 1, ports.PORT_MAX)
        return ((port_base, last),)
    limit = min(max_tasks, ports.PORT_MAX + 1 - ports.PORT_MIN)
    spans = []
    for ntasks in range(1, limit + 1):
        spans.extend(ports.job_port_spans(key, ntasks))
    return merge_ranges(spans)


def merge_ranges(spans: Iterable[PortRange]) -> tuple[PortRange, ...]:
    """Sorted, overlapping or touching ranges joined."""
    merged: list[PortRange] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return tuple(merged)


def split_families(addresses: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """IPv4 and IPv6 addresses apart, each once, in order (loopback dropped: ``lo`` is
    accepted as a whole)."""
    v4: dict[str, None] = {}
    v6: dict[str, None] = {}
    for text in addresses:
        address = ipaddress.ip_address(text.split("%", 1)[0])
        if address.is_loopback:
            continue
        (v4 if address.version == 4 else v6)[str(address)] = None
    return tuple(v4), tuple(v6)


def _elements(items: Sequence[str]) -> str:
    return "{ " + ", ".join(items) + " }"


def _port_text(span: PortRange) -> str:
    first, last = span
    return str(first) if first == last else f"{first}-{last}"


def _set(name: str, kind: str, items: Sequence[str], interval: bool = False) -> list[str]:
    lines = [f"\tset {name} {{", f"\t\ttype {kind}"]
    if interval:
        lines.append("\t\tflags interval")
    if items:
        lines.append(f"\t\telements = {_elements(items)}")
    return [*lines, "\t}"]


def render_apply(rules: JobRules) -> str:
    """``nft -f`` input that (re)creates the job's table atomically: run it twice, get one."""
    name = f"{FAMILY} {rules.table}"
    lines = [f"table {name}", f"delete table {name}", f"table {name} {{"]
    lines += _set("ports", "inet_service", [_port_text(s) for s in rules.ports], interval=True)
    guard = ['\t\tiifname "lo" accept']
    if rules.peers4:
        lines += _set("peers4", "ipv4_addr", rules.peers4)
        guard.append("\t\tip saddr @peers4 accept")
    if rules.peers6:
        lines += _set("peers6", "ipv6_addr", rules.peers6)
        guard.append("\t\tip6 saddr @peers6 accept")
    guard.append("\t\tcounter drop")
    lines += [
        "\tchain input {",
        f"\t\ttype filter hook input priority {PRIORITY}; policy accept;",
        "\t\ttcp dport @ports jump guard",
        "\t}",
        "\tchain guard {",
        *guard,
        "\t}",
    ]
    if rules.uid is not None:
        others = " ".join(f"meta skuid != {uid}" for uid in dict.fromkeys((0, rules.uid)))
        lines += [
            "\tchain output {",
            f"\t\ttype filter hook output priority {PRIORITY}; policy accept;",
            f"\t\ttcp dport @ports {others} counter drop",
            "\t}",
        ]
    return "\n".join([*lines, "}"]) + "\n"


def render_remove(job_id: int) -> str:
    """``nft -f`` input that removes the job's table, present or not."""
    name = f"{FAMILY} {table_name(job_id)}"
    return f"table {name}\ndelete table {name}\n"


def parse_settings(text: str, name: str = SETTINGS_NAME) -> dict[str, str]:
    """``key = value`` lines (``#`` comments); keys from :data:`SETTINGS_KEYS`."""
    settings: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = (part.strip() for part in line.partition("="))
        if not sep or key not in SETTINGS_KEYS:
            raise InputError(
                f"{name} line {number}",
                raw.strip(),
                "is not a known `key = value` setting",
                f"use one of {', '.join(SETTINGS_KEYS)}",
            )
        settings[key] = value
    return settings


def render_settings(
    python: str,
    *,
    log: str = "",
    port_base: int | None = None,
    address_template: str = "",
    scontrol: str = "",
) -> str:
    """The text of ``slurmtf-firewall.conf`` (only ``python`` is needed; ``scontrol``
    names the cluster's own where it is not on the prolog's PATH)."""
    lines = [
        "# slurmtf per-job firewall settings; beside slurm.conf on every node.",
        "# python: an interpreter that has slurmtf's dependencies installed.",
        f"python = {python}",
    ]
    if log:
        lines.append(f"log = {log}")
    if port_base is not None:
        lines.append(f"port_base = {port_base}")
    if address_template:
        lines.append(f"address_template = {address_template}")
    if scontrol:
        lines.append(f"scontrol = {scontrol}")
    return "\n".join(lines) + "\n"


def slurm_conf_lines(prolog: str, epilog: str) -> list[str]:
    """The slurm.conf lines that run the firewall on every node of every job."""
    return [
        f"Prolog={prolog}",
        f"Epilog={epilog}",
        # Alloc: the prolog runs on every node when the job starts, before any task.
        "PrologFlags=Alloc",
    ]
