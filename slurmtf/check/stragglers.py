"""Stragglers in a running job: which rank or node slows every step, by how much, since when.

Pure: per-rank samples in, findings, reports and the ``slurmtf status`` line out. The
training loop measures (slurmtf/training/steptiming.py); this module decides.

A sample covers one interval (``--timing_every`` seconds) of one rank: its mean
``compute`` per step (step start to gradients ready), its mean ``wait`` per step (from
there to the reduced gradients applied: the all-reduce, which waits for the slowest
peer), and the rate its sends to each other node reached while the kernel had data in
flight (Mbit/s). Two kinds of straggler, both judged against the median of the others
(:mod:`slurmtf.check.outliers`, the rule ``slurmtf check`` uses too):

* **compute**: a rank whose compute is more than :data:`COMPUTE_FACTOR` times the
  median of the other ranks'. What it costs the job: its extra compute, as a share of
  the median step (every other rank waits that long at the all-reduce).
* **link**: a node whose FASTEST link (sending or receiving, as measured by either end)
  is more than :data:`LINK_FACTOR` times slower than the median of the other nodes'
  fastest links. A ring passes every byte over every node's link, so one slow node
  stretches everyone's wait alike; only the link figures tell which node it is. What it
  costs: the median share of the step spent waiting, times the part of the link's rate
  missing (``1 - rate / median``).

Only a finding costing at least :data:`MIN_COST` of each step counts. A finding must
hold in every sample for ``window`` seconds, and in two samples at least, before it is
reported (one ``straggler``
event, one log line); a rank reported is ``recovered`` once when no sample has named
it for ``window`` seconds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurmtf.check.outliers import outliers

COMPUTE_FACTOR = 1.5  # compute this many times the median of the others
LINK_FACTOR = 3.0  # a node's fastest link this many times below the others' median
MIN_COST = 0.10  # a straggler costs at least this share of each step


@dataclass(frozen=True)
class RankSample:
    """One rank over one interval: mean seconds per step, send rates per peer node."""

    rank: int
    node: str
    compute_s: float
    wait_s: float
    links: Mapping[str, float] = field(default_factory=dict)  # peer node -> Mbit/s
    # its GPUs (utilisation %, MiB used, MiB in all) where nvidia-smi answered, else None
    gpu: tuple[float, float, float] | None = None

    @property
    def step_s(self) -> float:
        return self.compute_s + self.wait_s


@dataclass(frozen=True)
class Finding:
    """The rank (and its node) slowing the job in one interval, and what it costs."""

    rank: int
    node: str
    kind: str  # "compute" or "link"
    cost: float  # share of each step (0..1)
    detail: str  # e.g. "link 95 Mbit/s, 9.6x below the median"


def find(samples: Sequence[RankSample]) -> Finding | None:
    """The straggler in one interval's samples (one per rank), or ``None`` if balanced."""
    if len(samples) < 2:
        return None
    found = [f for f in (_compute_straggler(samples), _link_straggler(samples)) if f]
    found = [f for f in found if f.cost >= MIN_COST]
    return max(found, key=lambda f: f.cost, default=None)


def _compute_straggler(samples: Sequence[RankSample]) -> Finding | None:
    found = outliers(dict(enumerate(s.compute_s for s in samples)), COMPUTE_FACTOR, above=True)
    step = statistics.median(s.step_s for s in samples)
    if not found or step <= 0:
        return None
    worst = max(found, key=lambda o: o.value)
    slow = samples[worst.key]
    cost = min((slow.compute_s - worst.median) / step, 1.0)
    detail = f"compute {slow.compute_s * 1e3:.0f} ms a step, {worst.times:.1f}x the median"
    return Finding(slow.rank, slow.node, "compute", cost, detail)


def node_link_rates(samples: Iterable[RankSample]) -> dict[str, float]:
    """Each node's fastest measured link (Mbit/s), its own sends and its peers' to it."""
    best: dict[str, float] = {}
    for sample in samples:
        for peer, rate in sample.links.items():
            if rate <= 0 or peer == sample.node:
                continue
            for node in (sample.node, peer):
                best[node] = max(best.get(node, 0.0), rate)
    return best


def _link_straggler(samples: Sequence[RankSample]) -> Finding | None:
    rates = node_link_rates(samples)
    if len(rates) < 3:  # with two nodes, one link: no way to tell which end is slow
        return None
    found = outliers(rates, LINK_FACTOR)
    if not found:
        return None
    worst = min(found, key=lambda o: o.value)
    node = worst.key
    waiting = statistics.median(s.wait_s / s.step_s for s in samples if s.step_s > 0)
    cost = waiting * (1.0 - worst.value / worst.median)
    rank = min(s.rank for s in samples if s.node == node) if _on(samples, node) else -1
    detail = f"link {worst.value:.0f} Mbit/s, {worst.times:.1f}x below the median"
    return Finding(rank, node, "link", cost, detail)


def _on(samples: Sequence[RankSample], node: str) -> bool:
    return any(s.node == node for s in samples)


@dataclass(frozen=True)
class Report:
    """What to say once: ``straggler`` (with since) or ``straggler_recovered``."""

    event: str
    finding: Finding
    since: float  # wall time the straggler was first seen (or, recovered: last seen)

    def fields(self) -> dict[str, Any]:
        """The event's fields (slurmtf.events)."""
        f = self.finding
        return {
            "rank": f.rank, "node": f.node, "kind": f.kind, "cost": round(f.cost, 4),
            "detail": f.detail, "since": round(self.since, 3),
        }  # fmt: skip

    def message(self) -> str:
        """The chief's log line."""
        if self.event == "straggler_recovered":
            return f"straggler recovered: {_who(self.finding)} (last slow at {clock(self.since)})"
        return f"straggler: {describe(self.finding, self.since)}"


class Tracker:
    """Turns one finding per interval into reports: once after ``window_s`` of the same
    rank, once more when it has been absent ``window_s``. Times are wall seconds."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._candidate: tuple[int, str, float] | None = None  # rank, node, first seen
        self._count = 0  # intervals in a row that named the candidate
        self._reported: Report | None = None
        self._last_seen = 0.0

    def update(self, start: float, end: float, finding: Finding | None) -> list[Report]:
        """One interval ``[start, end]`` and its finding (``None``: balanced)."""
        out: list[Report] = []
        key = None if finding is None else (finding.rank, finding.node)
        if self._reported is not None:
            reported = self._reported.finding
            if key == (reported.rank, reported.node):
                self._last_seen = end
            elif end - self._last_seen >= self.window_s:
                out.append(Report("straggler_recovered", reported, self._last_seen))
                self._reported = None
        if finding is None or key is None:
            self._candidate = None
            return out
        if self._candidate is None or self._candidate[:2] != key:
            self._candidate, self._count = (*key, start), 0
        self._count += 1
        since = self._candidate[2]
        # at least two intervals: one long interval (a pause, a retrace) is still a blip
        if self._reported is None and end - since >= self.window_s and self._count >= 2:
            self._reported = Report("straggler", finding, since)
            self._last_seen = end
            out.append(self._reported)
        return out


def _who(finding: Finding) -> str:
    rank = f" (rank {finding.rank})" if finding.rank >= 0 else ""
    return f"{finding.node}{rank}"


def clock(wall: float) -> str:
    """Wall seconds -> local ``HH:MM:SS``."""
    return time.strftime("%H:%M:%S", time.localtime(wall))


def describe(finding: Finding, since: float) -> str:
    """``node3 (rank 2): 42 % of each step waiting on it since 16:40:12 (link ...)``."""
    return (
        f"{_who(finding)}: {finding.cost * 100:.0f} % of each step waiting on it since "
        f"{clock(since)} ({finding.detail})"
    )


def status_line(events: Iterable[Mapping[str, Any]]) -> str | None:
    """``slurmtf status``'s line from the chief's events: the straggler now, the last one
    that recovered, or ``None`` when none was ever reported."""
    last = None
    for event in events:
        if event.get("event") in ("straggler", "straggler_recovered"):
            last = event
    if last is None:
        return None
    try:
        finding = Finding(
            int(last["rank"]), str(last["node"]), str(last.get("kind", "")),
            float(last["cost"]), str(last.get("detail", "")),
        )  # fmt: skip
        since = float(last["since"])
    except (KeyError, TypeError, ValueError):
        return None
    if last["event"] == "straggler":
        return f"straggler: {describe(finding, since)}"
    return f"straggler: none now ({_who(finding)} recovered, last slow at {clock(since)})"
