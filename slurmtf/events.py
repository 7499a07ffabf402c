"""Event lines: one JSON object per line on a rank's stdout, ``{"event": NAME, ...}``.

The one writer (:func:`emit`) and the one reader (:func:`parse_events`,
:func:`read_events`) of what the launcher, the training loops and ``model.fit``
callbacks report, and of what ``slurmtf status``, the tests and the benchmarks read back.
Nothing reads the human progress text. Every event has a ``time`` (seconds since the
epoch). Events (fields beyond ``event`` and ``time``):

* ``cluster`` (rank, workers, GPUs ..., ``port_rule``: how this attempt's ports follow
  from the job, the attempt and the rank, ``workers_changed_from``: the previous start's
  worker count when a ``--nodes`` range restarted on another), ``progress`` (step, total,
  loss, accuracy, examples_per_sec), ``timing`` (every rank: compute and wait per step,
  link rates), ``straggler``/``straggler_recovered`` (chief), ``eval``, ``checkpoint`` (chief: step,
  seconds training stood still, asynchronous),
  ``preempted``, ``done`` (step, preempted), ``trains`` (chief: the attempt's first
  step), ``warm`` (a warm rank ready: rank, seconds its imports took) from the training
  loop (``eval`` and ``done`` also from a sidecar evaluator task, with ``role``);
  ``start``/``exit``
  (status) from the per-task launcher; ``port_in_use`` (rank, port, node, holder,
  ``moves``: whether a restart takes other ports) from a rank whose port another process
  holds (:mod:`slurmtf.runtime.rank.held_port`).

The node's file: the events a job's supervisor acts on while a step runs
(:data:`SUPERVISED`: ``peer_lost``; ``trains``, the chief's first step of an attempt,
after which the supervisor starts the next attempt's warm ranks) also go, as the same
line, to one file per node named by ``SLURMTF_NODE_EVENTS`` (a path whose ``%N``
stands for the node, ``SLURMD_NODENAME``; the supervisor sets it for its steps). Every
rank of a node appends to that file, each line with one ``write`` on a descriptor opened
with ``O_APPEND``, so lines of the ranks of one node never mix; the supervisor's look
opens one file per node (:mod:`slurmtf.runtime.job.follow`), never one per rank. This
module is the one reader of that variable.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

Event = dict[str, Any]

NODE_EVENTS_VAR = "SLURMTF_NODE_EVENTS"
NODE_MARK = "%N"  # as in srun's --output patterns: the node's name
# The events a supervisor acts on during a step: also appended to the node's file.
SUPERVISED = frozenset({"peer_lost", "trains"})
_node_file: dict[str, int] = {}  # the node file's path -> its descriptor (-1: unusable)


def emit(event: str, **fields: Any) -> None:
    """Print one ``{"event": event, **fields, "time": T}`` line on stdout and flush it
    (``T``: when, seconds since the epoch, unless ``fields`` has a ``time``); a
    :data:`SUPERVISED` event goes to the node's file too."""
    fields.setdefault("time", round(time.time(), 3))
    line = json.dumps({"event": event, **fields}, default=_jsonable) + "\n"
    sys.stdout.write(line)
    sys.stdout.flush()
    if event in SUPERVISED:
        to_node_file(line.encode(), os.environ)


def node_events_path(pattern: str, node: str) -> Path:
    """The node file of ``node`` named by a ``SLURMTF_NODE_EVENTS`` pattern."""
    return Path(pattern.replace(NODE_MARK, node))


def to_node_file(data: bytes, environ: Mapping[str, str]) -> bool:
    """Append ``data`` (one line) to this node's file with one ``write``; False when the
    process has none (outside a supervised step) or cannot write it (said once)."""
    pattern, node = environ.get(NODE_EVENTS_VAR, ""), environ.get("SLURMD_NODENAME", "")
    if not pattern or not node:
        return False
    path = str(node_events_path(pattern, node))
    fd = _node_file.get(path)
    if fd is None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            print(f"slurmtf: {NODE_EVENTS_VAR}: cannot append to {path}: {exc}", file=sys.stderr)
            fd = -1
        _node_file[path] = fd
    if fd < 0:
        return False
    try:
        return os.write(fd, data) == len(data)
    except OSError:
        return False


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
