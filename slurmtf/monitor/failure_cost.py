"""What a job's failures cost, from rank 0's events and the job's recovery record (pure).

Each start of rank 0 (a ``cluster`` event) begins an attempt. For each attempt after the
first:

- steps redone: how far the attempt before got (its highest ``progress``, ``done`` or
  ``rescued`` step) less the step this one resumed at (the chief's ``resumed`` event;
  step 0 when it logged none);
- seconds lost: from the last step event before the failure to the first one after it,
  less the time the steps between them take at the job's usual pace (the median seconds
  per step between two step events of one attempt, the first interval of each attempt,
  which holds the compilation, left out).

Goodput is one less the seconds lost over the wall time from the first step event to the
last. Events without a ``time`` (written before events carried one) give steps but no seconds.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from slurmtf.events import Event

STEP_EVENTS = ("progress", "done")
AGAIN = ("restart", "requeue")  # the record's actions after which the job ran again


@dataclasses.dataclass(frozen=True)
class Cost:
    """A job's failures so far, summed: ``seconds_lost``/``goodput`` are ``None`` when
    the events do not tell (no step events, or no times)."""

    failures: int
    steps_redone: int = 0
    seconds_lost: float | None = None
    goodput: float | None = None

    def words(self) -> str:
        """``2 failures: 3.4 s lost, 1 step redone, goodput 0.98``."""
        failures = "1 failure" if self.failures == 1 else f"{self.failures} failures"
        parts = [f"{self.seconds_lost:.1f} s lost"] if self.seconds_lost is not None else []
        steps = "step" if self.steps_redone == 1 else "steps"
        parts.append(f"{self.steps_redone} {steps} redone")
        if self.goodput is not None:
            parts.append(f"goodput {self.goodput:.2f}")
        return f"{failures}: {', '.join(parts)}"


def attempts(events: Iterable[Event]) -> list[list[Event]]:
    """Rank 0's events cut at each of its starts (``cluster`` events); events before the
    first start are dropped."""
    cut: list[list[Event]] = []
    for event in events:
        if event.get("event") == "cluster":
            cut.append([])
        if cut:
            cut[-1].append(event)
    return cut


def job_cost(chief_events: Sequence[Event], records: Sequence[Mapping[str, Any]]) -> Cost:
    """The failures of the job whose rank 0 logged ``chief_events`` and whose recovery
    record is ``records`` (restarts in place and requeues: the failures it ran again
    after; a job rank 0 started more often than that counts its starts)."""
    runs = attempts(chief_events)
    failures = max(sum(1 for r in records if r.get("action") in AGAIN), len(runs) - 1)
    if len(runs) < 2:
        return Cost(failures, goodput=1.0 if _timed_steps(runs) else None)
    redone = sum(_redone(before, after) for before, after in itertools.pairwise(runs))
    pace = _pace(runs)
    timed = _timed_steps(runs)
    if pace is None or len(timed) < 2:
        return Cost(failures, redone)
    lost = sum(_lost(before, after, pace) for before, after in itertools.pairwise(runs))
    wall = timed[-1][0] - timed[0][0]
    goodput = max(0.0, 1.0 - lost / wall) if wall > 0 else None
    return Cost(failures, redone, round(lost, 3), goodput)


def _steps(run: Sequence[Event], names: Sequence[str] = STEP_EVENTS) -> list[int]:
    return [e["step"] for e in run if e.get("event") in names and isinstance(e.get("step"), int)]


def _timed(run: Sequence[Event]) -> list[tuple[float, int]]:
    """(time, step) of the attempt's step events that carry a time."""
    return [
        (float(e["time"]), int(e["step"]))
        for e in run
        if e.get("event") in STEP_EVENTS
        and isinstance(e.get("step"), int)
        and isinstance(e.get("time"), int | float)
    ]


def _timed_steps(runs: Sequence[Sequence[Event]]) -> list[tuple[float, int]]:
    return [pair for run in runs for pair in _timed(run)]


def _redone(before: Sequence[Event], after: Sequence[Event]) -> int:
    reached = _steps(before, (*STEP_EVENTS, "rescued"))
    resumed = _steps(after, ("resumed",))
    if not reached:
        return 0
    return max(max(reached) - (resumed[0] if resumed else 0), 0)


def _pace(runs: Sequence[Sequence[Event]]) -> float | None:
    """The median seconds per step between two step events of one attempt, the first
    interval of each attempt left out."""
    rates = []
    for run in runs:
        timed = _timed(run)
        for (t0, s0), (t1, s1) in list(itertools.pairwise(timed))[1:]:
            if s1 > s0:
                rates.append((t1 - t0) / (s1 - s0))
    return statistics.median(rates) if rates else None


def _lost(before: Sequence[Event], after: Sequence[Event], pace: float) -> float:
    """The seconds between the last step event before a failure and the first after it,
    less what the steps between them take at ``pace``."""
    last, first = _timed(before), _timed(after)
    if not last or not first:
        return 0.0
    (t0, s0), (t1, s1) = last[-1], first[0]
    return max(t1 - t0 - max(s1 - s0, 0) * pace, 0.0)
