"""Node-count ranges (``--nodes=2-4``) and what a job that changes size says about it.

A range job runs on as many nodes as Slurm can give within the range, at each (re)start;
the global batch stays the same and the per-replica batch follows the worker count.
Pure functions of values: the range itself, the worker counts a global batch splits over,
the ``slurmtf status`` line about the worker count, and Slurm's pending reason in words.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

from slurmtf.cluster.hostlists import expand_hostlist
from slurmtf.errors import InputError

_RANGE = re.compile(r"^([0-9]+)(?:-([0-9]+))?$")
SHOWN_COUNTS = 8  # a batch-division hint lists at most this many worker counts


@dataclasses.dataclass(frozen=True)
class NodeRange:
    """``low`` to ``high`` nodes (equal for a fixed count)."""

    low: int
    high: int

    @property
    def is_range(self) -> bool:
        return self.high > self.low

    def __str__(self) -> str:
        return f"{self.low}-{self.high}" if self.is_range else str(self.low)


def parse_nodes(text: object, flag: str = "--nodes") -> NodeRange:
    """``"4"`` or ``"2-4"`` (as sbatch's ``--nodes``) -> a :class:`NodeRange`."""
    match = _RANGE.match(str(text).strip())
    hint = f"a count or a range MIN-MAX, e.g. {flag}=2 or {flag}=2-4"
    if match is None:
        raise InputError(flag, text, "is not a node count or range", hint)
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) is not None else low
    if low < 1:
        raise InputError(flag, text, "must be at least 1 node", hint)
    if high < low:
        raise InputError(flag, text, "has its maximum below its minimum", f"{flag}={high}-{low}")
    return NodeRange(low, high)


def dividing_counts(batch_size: int, limit: int = 64) -> list[int]:
    """The counts from 1 to ``limit`` that split ``batch_size`` evenly."""
    return [n for n in range(1, min(batch_size, limit) + 1) if batch_size % n == 0]


def split_counts(batch_size: int, local_replicas: int = 1) -> str:
    """The worker counts (of ``local_replicas`` replicas each) that split ``batch_size``
    evenly, as a hint's words: ``1, 2, 4, 8, ...``."""
    local = max(local_replicas, 1)
    counts = [n for n in dividing_counts(batch_size) if batch_size % (n * local) == 0]
    more = ", ..." if len(counts) > SHOWN_COUNTS else ""
    return ", ".join(str(n) for n in counts[:SHOWN_COUNTS]) + more if counts else "none"


def workers_line(clusters: Iterable[Mapping[str, Any]]) -> str | None:
    """From rank 0's ``cluster`` events, oldest first: ``2 workers (was 3 before restart
    1)`` when the worker count changed over the restarts, else ``None``."""
    seen = [(e["num_workers"], e.get("restart_count", 0)) for e in clusters
            if isinstance(e.get("num_workers"), int)]  # fmt: skip
    changes = [
        (seen[i - 1][0], seen[i][1]) for i in range(1, len(seen)) if seen[i][0] != seen[i - 1][0]
    ]
    if not changes:
        return None
    before, restart = changes[-1]
    now = seen[-1][0]
    return f"{now} worker{'' if now == 1 else 's'} (was {before} before restart {restart})"


# Slurm's pending reasons (squeue's REASON, scontrol's Reason=) in words, by prefix.
_REASONS = (
    ("Resources", "waits for free nodes"),
    ("ReqNodeNotAvail", "waits for nodes that are down, drained or reserved"),
    ("Nodes_required_for_job_are_DOWN", "waits for nodes that are down, drained or reserved"),
    ("NodeDown", "waits: a node it needs is down"),
    ("Priority", "waits behind jobs of higher priority"),
    ("BeginTime", "was requeued and waits for its begin time, a few seconds"),
    ("PartitionNodeLimit", "asks more nodes than the partition allows"),
    ("JobHeldAdmin", "is held by an administrator"),
    ("JobHeldUser", "is held: scontrol release JOB"),
)
_FOR_NODES = ("Resources", "ReqNodeNotAvail", "Nodes_required_for_job_are_DOWN", "NodeDown")


def pending_line(fields: Mapping[str, str], unavailable: Mapping[str, str]) -> str | None:
    """Why a pending job waits, in words, from its ``scontrol`` record and the
    unavailable nodes (name -> state and reason); ``None`` when it does not wait."""
    if fields.get("JobState") != "PENDING":
        return None
    reason = fields.get("Reason", "None")
    said = reason.replace("_", " ")
    words = next((f"{w} ({said})" for key, w in _REASONS if reason.startswith(key)), None)
    low, _, high = fields.get("NumNodes", "?").partition("-")
    asked = low if high in ("", low) else f"{low}-{high}"
    line = f"  pending: {words or f'waits ({said})'}; it asks {asked} node(s)"
    if unavailable:
        listed = ", ".join(f"{n} {s}" for n, s in sorted(unavailable.items()))
        line += f"; unavailable: {listed}"
    if reason.startswith(_FOR_NODES) and "-" not in asked:
        line += " (a --nodes=MIN-MAX range would start on the nodes left)"
    return line


# The reasons of a job Slurm cannot start on the nodes it may have (an admin's to fix).
_CANNOT_START = ("BadConstraints", "ReqNodeNotAvail", "Nodes_required_for_job_are_DOWN")


def admin_line(
    job_id: str, fields: Mapping[str, str], unavailable: Mapping[str, str]
) -> str | None:
    """One line for a pending job Slurm cannot start (BadConstraints, ReqNodeNotAvail,
    "Nodes required for job are DOWN, DRAINED ..."): why, and what an admin runs, naming
    the out-of-service nodes it asks by name (any when it names none); ``None`` else."""
    reason = fields.get("Reason", "")
    if fields.get("JobState") != "PENDING" or not reason.startswith(_CANNOT_START):
        return None
    asked = _names(fields.get("ReqNodeList", ""))
    nodes = [n for n in unavailable if not asked or n in asked]
    excluded = _names(fields.get("ExcNodeList", ""))
    if nodes:
        listed = ", ".join(f"{n} {unavailable[n]}" for n in nodes)
        return (f"  why: it needs node(s) Slurm took out of service ({listed}); HINT: an admin "
                f"runs `scontrol update nodename={','.join(nodes)} state=resume` once they "
                "are fine")  # fmt: skip
    if excluded:
        return (f"  why: the nodes left without {','.join(excluded)} (ExcNodeList) cannot give "
                f"its node count; HINT: `scontrol update jobid={job_id} ExcNodeList=` lets it "
                "start")  # fmt: skip
    return (f"  why: Slurm cannot give it the nodes it asks ({reason.replace('_', ' ')}); "
            "HINT: an admin looks at `sinfo -R`")  # fmt: skip


def _names(text: str) -> list[str]:
    if not text or text == "(null)":
        return []
    try:
        return expand_hostlist(text)
    except InputError:
        return []


def parse_nodes_states(text: str) -> dict[str, str]:
    """``sinfo -h -N -o '%N|%t|%E'`` -> the nodes that cannot run jobs (down, drained,
    draining, failing), name -> ``state (reason)``."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        parts = raw.strip().split("|", 2)
        if len(parts) < 2:
            continue
        name, state = parts[0], parts[1].rstrip("*~#!%$@^-")
        reason = parts[2].strip() if len(parts) > 2 else ""
        if state.startswith(("down", "drain", "drng", "fail", "inval")):
            out[name] = f"{state} ({reason})" if reason and reason != "none" else state
    return out
