"""Outliers by the median: the one rule of ``slurmtf check`` and the straggler detector.

A value is an outlier when it is more than ``factor`` times below (or above) the median
of the OTHER values: an outlier never pulls down the median it is judged against, so
two nodes are enough to name a slow one. Pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class OffMedian(Generic[K]):
    """``key``'s ``value``, ``times`` (> factor) below or above ``median`` (the others')."""

    key: K
    value: float
    median: float
    times: float


def outliers(values: Mapping[K, float], factor: float, above: bool = False) -> list[OffMedian[K]]:
    """The values more than ``factor`` times below (``above``: above) the median of the
    others, in the order of ``values``; none with fewer than two values or a median of 0."""
    found = []
    for key, value in values.items():
        others = [v for k, v in values.items() if k != key]
        mid = statistics.median(others) if others else 0.0
        if mid <= 0:
            continue
        if above and value > factor * mid:
            found.append(OffMedian(key, value, mid, value / mid))
        elif not above and value * factor < mid:
            found.append(OffMedian(key, value, mid, mid / value if value > 0 else float("inf")))
    return found
