"""The restart budget: what ``MAX_RESTARTS`` counts, and whether this failure may restart.

Two meanings (``RESTART_BUDGET``, :data:`MODES`):

* ``progress`` (the default): ``MAX_RESTARTS`` counts the failures in a row after which
  training did not advance. A failure whose attempt reached a step beyond every step the
  job reached before (its ranks' ``progress`` and ``done`` events) resets the count, so a
  job that trains for days and fails now and then goes on; one that keeps failing at the
  same place stops after ``MAX_RESTARTS`` restarts.
* ``total``: every restart in place and every requeue of the job's whole life counts.

``MAX_FAILURES_PER_HOUR`` (0, the default: no limit) also stops a job that failed more
than that many times within the last hour, however far each attempt got.

Pure: :func:`count_budget` takes the job's record (its decisions, as read by
:mod:`slurmtf.runtime.recovery.record`) and this failure's evidence, and returns a
:class:`Budget` that :mod:`slurmtf.runtime.recovery.decision` judges.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from slurmtf.errors import InputError

MODES = ("progress", "total")
DEFAULT_MODE = "progress"
HOUR_S = 3600.0
AGAIN = ("restart", "requeue")  # the record's actions that cost the budget


@dataclasses.dataclass(frozen=True)
class Policy:
    """The job's budget settings: ``MAX_RESTARTS``, ``RESTART_BUDGET`` and
    ``MAX_FAILURES_PER_HOUR`` (0: no limit)."""

    limit: int = 3
    mode: str = DEFAULT_MODE
    per_hour: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InputError("RESTART_BUDGET", self.mode, "is not a budget", _MODE_HINT)
        if self.limit < 0:
            raise InputError("MAX_RESTARTS", str(self.limit), "is negative", "e.g. MAX_RESTARTS=3")
        if self.per_hour < 0:
            raise InputError(
                "MAX_FAILURES_PER_HOUR", str(self.per_hour), "is negative",
                "leave it unset or 0 (no limit), e.g. MAX_FAILURES_PER_HOUR=6",
            )  # fmt: skip


_MODE_HINT = (
    "RESTART_BUDGET=progress (the default: MAX_RESTARTS counts failures in a row without "
    "progress) or RESTART_BUDGET=total (every restart and requeue counts)"
)


def parse_mode(text: str, name: str = "RESTART_BUDGET") -> str:
    """``RESTART_BUDGET`` (or a flag named ``name``) as typed: ``progress`` or ``total``."""
    mode = text.strip().lower() or DEFAULT_MODE
    if mode not in MODES:
        raise InputError(name, text, "is not a restart budget", _MODE_HINT)
    return mode


@dataclasses.dataclass(frozen=True)
class Budget:
    """What this failure finds: ``used``, the failures that count against ``limit`` before
    it (``total``: every restart so far; ``progress``: those in a row without progress);
    ``progressed``: this failure's attempt reached ``reached``, beyond every step before;
    ``restarts``: every restart and requeue so far (-1: ``used``); ``last_hour``: the
    failures within the hour before this one, against ``per_hour`` (0: no limit)."""

    used: int
    limit: int
    mode: str = DEFAULT_MODE
    progressed: bool = False
    reached: int | None = None
    restarts: int = -1
    per_hour: int = 0
    last_hour: int = 0

    @property
    def so_far(self) -> int:
        return self.used if self.restarts < 0 else self.restarts

    @property
    def too_often(self) -> bool:
        return bool(self.per_hour) and self.last_hour >= self.per_hour

    @property
    def spent(self) -> bool:
        if self.limit <= 0 or self.too_often:
            return True
        if self.mode == "progress" and self.progressed:
            return False
        return self.used >= self.limit

    def counted(self) -> str:
        """This restart as the budget counts it ("" for ``total``: ``restart N of M``)."""
        if self.mode != "progress":
            return ""
        if self.progressed:
            return f"0 of {self.limit} without progress: training reached step {self.reached}"
        return f"{self.used + 1} of {self.limit} without progress"

    def why_spent(self) -> str:
        """Why no restart is left, naming the setting."""
        if self.too_often:
            return (
                f"{self.last_hour + 1} failures within an hour "
                f"(MAX_FAILURES_PER_HOUR={self.per_hour})"
            )
        if self.mode == "progress" and self.limit > 0:
            return (
                f"already restarted {self.used} time(s) in a row without progress "
                f"(MAX_RESTARTS={self.limit})"
            )
        return f"already restarted {self.used} time(s) (MAX_RESTARTS={self.limit})"


def best_step(records: Sequence[Mapping[str, Any]]) -> int | None:
    """The highest step the record's attempts reached (``reached``), if any."""
    steps = [r["reached"] for r in records if isinstance(r.get("reached"), int)]
    return max(steps) if steps else None


def advanced(reached: int | None, before: int | None) -> bool:
    """Whether an attempt that reached ``reached`` trained beyond ``before``."""
    return reached is not None and reached > (before if before is not None else 0)


def count_budget(
    records: Sequence[Mapping[str, Any]],
    slurm_requeues: int,
    policy: Policy,
    reached: int | None = None,
    now: float | None = None,
) -> Budget:
    """The budget this failure finds: the job's ``records`` (each restart or requeue with
    its ``time`` and, when known, its ``progress`` and ``reached``), Slurm's requeues
    (``SLURM_RESTART_COUNT``: those no decision recorded count as failures without
    progress), this attempt's highest step ``reached`` and the time ``now``."""
    again = [r for r in records if r.get("action") in AGAIN]
    recorded = sum(1 for r in again if r.get("action") == "requeue")
    unrecorded = max(0, slurm_requeues - recorded)
    restarts = len(again) + unrecorded
    streak = unrecorded
    for record in reversed(again):
        if record.get("progress"):
            break
        streak += 1
    last_hour = 0
    if now is not None:
        last_hour = sum(1 for r in again if _time(r) > now - HOUR_S)
    used = restarts if policy.mode == "total" else streak
    progressed = advanced(reached, best_step(records))
    return Budget(
        used, policy.limit, policy.mode, progressed, reached, restarts, policy.per_hour, last_hour
    )


def _time(record: Mapping[str, Any]) -> float:
    value = record.get("time")
    return float(value) if isinstance(value, (int, float)) else 0.0
