"""The verdict of ``slurmtf check``: per-node measurements in, outliers and a table out.

Pure: no TensorFlow, no sockets. A node is an *outlier* when one of its figures (link
out, link in, compute) is more than ``threshold`` times (default :data:`DEFAULT_THRESHOLD`)
below the median of that figure over the allocation's other nodes
(:mod:`slurmtf.check.outliers`), or when it sees a different
number of GPUs than most nodes. Link figures come from a matrix of TCP rates between
every pair of ranks (``rates[src][dst]``, bits/s); a node's *out* is the median of what
it sent to each other rank and its *in* the median of what it received, so a bad link
at one node does not drag down the figures of the nodes that talk to it (3 nodes or
more; with 2 nodes one pair is all there is).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from slurmtf.check.outliers import outliers
from slurmtf.errors import InputError

DEFAULT_THRESHOLD = 3.0
EXIT_HEALTHY, EXIT_OUTLIER = 0, 1


@dataclass(frozen=True)
class NodeFigures:
    """What one rank measured: its node, GPUs, compute speed and all-reduce figure."""

    rank: int
    node: str
    device: str = "CPU"
    gpus: tuple[str, ...] = ()
    compute_gflops: float | None = None
    allreduce_gbps: float | None = None  # bus bandwidth, Gbit/s (nccl-tests' busbw)


@dataclass(frozen=True)
class Outlier:
    node: str
    rank: int
    figure: str  # "link out", "link in", "compute", "gpus"
    value: float
    median: float
    factor: float  # how many times below the median (gpus: 0)

    def line(self) -> str:
        """``node3: link out 0.1 Gb/s, 10x below the median (1 Gb/s)``."""
        if self.figure == "gpus":
            return f"{self.node}: sees {self.value:g} GPUs, most nodes {self.median:g}"
        unit = "GFLOP/s" if self.figure == "compute" else "Gb/s"
        return (f"{self.node}: {self.figure} {_num(self.value)} {unit}, "
                f"{self.factor:.0f}x below the median ({_num(self.median)} {unit})")  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    rows: tuple[dict[str, Any], ...]
    outliers: tuple[Outlier, ...]
    threshold: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return not self.outliers

    @property
    def exit_status(self) -> int:
        return EXIT_HEALTHY if self.healthy else EXIT_OUTLIER

    def to_json(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "threshold": self.threshold,
            "nodes": list(self.rows),
            "outliers": [asdict(o) for o in self.outliers],
            **self.extra,
        }


def check_threshold(value: float) -> float:
    if not value > 1.0:
        raise InputError("--threshold", value, "must be above 1", "use e.g. 3 (3x below median)")
    return value


def median(values: Sequence[float]) -> float:
    """The upper median: of [low, good] it is good (a node that met one bad peer)."""
    if not values:
        raise ValueError("median of no values")
    return sorted(values)[len(values) // 2]


def suspects(values: Sequence[float], threshold: float) -> set[int]:
    """Indexes of the values more than ``threshold`` times below the others' median."""
    return {o.key for o in outliers(dict(enumerate(values)), threshold)}


def link_figures(rates: Mapping[int, Mapping[int, float]], n: int) -> list[tuple[float, float]]:
    """(out, in) bits/s per rank from ``rates[src][dst]`` (missing pairs are ignored)."""
    out = []
    for r in range(n):
        sent = [v for dst, v in rates.get(r, {}).items() if dst != r]
        got = [row[r] for src, row in rates.items() if src != r and r in row]
        out.append((median(sent) if sent else 0.0, median(got) if got else 0.0))
    return out


def judge(
    figures: Sequence[NodeFigures],
    rates: Mapping[int, Mapping[int, float]],
    threshold: float = DEFAULT_THRESHOLD,
    extra: Mapping[str, Any] | None = None,
) -> Verdict:
    """The rows of the table and the outliers among the nodes (see the module doc)."""
    check_threshold(threshold)
    ordered = sorted(figures, key=lambda f: f.rank)
    links = link_figures(rates, len(ordered)) if rates else [(0.0, 0.0)] * len(ordered)
    rows = tuple(_row(f, out, inn) for f, (out, inn) in zip(ordered, links, strict=True))
    outliers: list[Outlier] = []
    for key, figure in (("link_out_gbps", "link out"), ("link_in_gbps", "link in"),
                        ("compute_gflops", "compute")):  # fmt: skip
        outliers += _below(rows, key, figure, threshold)
    outliers += _gpu_outliers(rows)
    return Verdict(rows, tuple(outliers), threshold, dict(extra or {}))


def _row(f: NodeFigures, out_bps: float, in_bps: float) -> dict[str, Any]:
    return {
        "rank": f.rank,
        "node": f.node,
        "role": "chief" if f.rank == 0 else "worker",
        "device": f.device,
        "gpus": list(f.gpus),
        "compute_gflops": f.compute_gflops,
        "link_out_gbps": out_bps / 1e9 if out_bps else None,
        "link_in_gbps": in_bps / 1e9 if in_bps else None,
        "allreduce_gbps": f.allreduce_gbps,
    }


def _below(
    rows: Sequence[dict[str, Any]], key: str, figure: str, threshold: float
) -> list[Outlier]:
    values = {i: r[key] for i, r in enumerate(rows) if r[key] is not None}
    return [
        Outlier(rows[o.key]["node"], rows[o.key]["rank"], figure, o.value, o.median, o.times)
        for o in outliers(values, threshold)
    ]


def _gpu_outliers(rows: Sequence[dict[str, Any]]) -> list[Outlier]:
    counts = [len(r["gpus"]) for r in rows]
    usual = max(set(counts), key=counts.count)
    return [Outlier(r["node"], r["rank"], "gpus", float(c), float(usual), 0.0)
            for r, c in zip(rows, counts, strict=True) if c != usual]  # fmt: skip


# ---- rendering ------------------------------------------------------------------------------
HEADERS = ("node", "role", "device", "compute GFLOP/s", "link out Gb/s", "link in Gb/s",
           "all-reduce Gb/s")  # fmt: skip


def table(verdict: Verdict) -> str:
    """The table a person reads; an outlier's figure carries a ``!`` and the node a ``*``."""
    marked = {(o.rank, o.figure) for o in verdict.outliers}
    cells = []
    for row in verdict.rows:
        bad = {fig for rank, fig in marked if rank == row["rank"]}
        gpus = f" ({len(row['gpus'])} GPU)" if row["gpus"] else ""
        cells.append([
            row["node"] + (" *" if bad else ""),
            row["role"],
            row["device"] + gpus + ("!" if "gpus" in bad else ""),
            _cell(row["compute_gflops"], "compute" in bad),
            _cell(row["link_out_gbps"], "link out" in bad),
            _cell(row["link_in_gbps"], "link in" in bad),
            _cell(row["allreduce_gbps"], False),
        ])  # fmt: skip
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(HEADERS)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def closing_line(verdict: Verdict) -> str:
    """One line: ``healthy: ...`` or ``OUTLIER node3: link out 0.1 Gb/s, 10x ...; ...``."""
    if verdict.healthy:
        return (f"healthy: {len(verdict.rows)} nodes, no figure {verdict.threshold:g}x "
                "below the median")  # fmt: skip
    lines: dict[str, list[str]] = {}
    for o in verdict.outliers:  # one clause per node: "node3: link out ...; link in ..."
        text = o.line()
        if o.node in lines:
            lines[o.node].append(text.split(": ", 1)[1])
        else:
            lines[o.node] = [text]
    return "OUTLIER " + "; ".join("; ".join(parts) for parts in lines.values())


def _cell(value: float | None, bad: bool) -> str:
    return ("—" if value is None else _num(value)) + ("!" if bad else "")


def _num(value: float) -> str:
    return f"{value:.3g}" if value < 1000 else f"{value:,.0f}"
