"""Event lines: one JSON object per line on a rank's stdout, ``{"event": NAME, ...}``.

The one writer (:func:`emit`) and the one reader (:func:`parse_events`,
:func:`read_events`) of what the launcher, the training loops and ``model.fit``
callbacks report, and of what ``slurmtf status``, the tests and the benchmarks read back.
Nothing reads the human progress text. Events (fields beyond ``event``):

* ``cluster`` (rank, workers, GPUs ..., ``port_rule``: how this attempt's ports follow
  from the job, the attempt and the rank, ``workers_changed_from``: the previous start's
  worker count when a ``--nodes`` range restarted on another), ``progress`` (step, total,
  loss, accuracy, examples_per_sec), ``timing`` (every rank: compute and wait per step,
  link rates), ``straggler``/``straggler_recovered`` (chief), ``eval``, ``checkpoint``,
  ``preempted``, ``done`` (step, preempted) from the training loop (``eval`` and ``done``
  also from a sidecar evaluator task, with ``role``); ``start``/``exit``
  (status) from the per-task launcher; ``port_in_use`` (rank, port, node, holder,
  ``moves``: whether a restart takes other ports) from a rank whose port another process
  holds (:mod:`slurmtf.runtime.held_port`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Event = dict[str, Any]


def emit(event: str, **fields: Any) -> None:
    """Print one ``{"event": event, **fields}`` line on stdout and flush it."""
    sys.stdout.write(json.dumps({"event": event, **fields}, default=_jsonable) + "\n")
    sys.stdout.flush()


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # NumPy and TensorFlow scalars
        return value.item()
    return str(value)


def parse_events(text: str) -> list[Event]:
    """The event lines in ``text``; every other line (logs, tracebacks) is skipped."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith("{") or '"event"' not in line:
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and "event" in value:
            out.append(value)
    return out


def read_events(path: Path) -> list[Event]:
    """The event lines of a log file; ``[]`` when it cannot be read."""
    try:
        return parse_events(path.read_text(errors="replace"))
    except OSError:
        return []


def named(events: Iterable[Event], name: str) -> list[Event]:
    """The events called ``name``, in order."""
    return [e for e in events if e.get("event") == name]


def last(events: Iterable[Event], name: str) -> Event | None:
    """The last event called ``name``, or ``None``."""
    found = named(events, name)
    return found[-1] if found else None
