"""The results table of a sweep (a job array): one row per point, built from values.

:func:`point_row` turns what is known of one array task (its Slurm state, restarts,
rank 0's event lines, its last error line, its log path) into a :class:`SweepRow`;
:func:`render_table`, :func:`render_csv` and :func:`render_json` print rows. Pure: the
reading of Slurm and logs is :mod:`slurmtf.monitor.sweeps`.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from slurmtf.contracts import is_final
from slurmtf.errors import InputError
from slurmtf.events import Event, last, named

# Columns besides the point's parameters; --sort takes any of them or a parameter name.
METRICS = ("accuracy", "loss", "examples_per_sec", "step", "restarts")
COLUMNS = ("task", "state", "restarts", "step", "loss", "accuracy", "examples_per_sec", "logs")


# The point's own words first: a Python exception line or a slurmtf one-line error
# (as slurmtf/job.sh's slurmtf_error_line), before srun's and slurmstepd's lines.
_OWN_ERROR = re.compile(
    r"^([A-Za-z_]\w*\.)*[A-Za-z_]\w*(Error|Exception|Exit|Interrupt)(:.*)?$|HINT: "
)
_OTHER_ERROR = re.compile(r"^srun: error|^slurmstepd\S*: error|Killed|^\w+: error")


def error_line(text: str) -> str | None:
    """The line of a rank's stderr that says why it failed: its last exception or
    one-line error, else srun's last error line; ``None`` without either."""
    lines = [line.strip() for line in text.splitlines()]
    own = [line for line in lines if _OWN_ERROR.search(line)]
    other = [line for line in lines if _OTHER_ERROR.search(line)]
    found = own or other
    return found[-1] if found else None


@dataclasses.dataclass(frozen=True)
class SweepRow:
    """One point of a sweep. ``final``: the metrics are the point's last word (its
    ``done`` event was logged or its state is final), else the latest seen (partial)."""

    task: str
    params: dict[str, str]
    state: str
    restarts: int
    step: int | None
    total: int | None
    loss: float | None
    accuracy: float | None
    examples_per_sec: float | None
    logs: str
    final: bool
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: object) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


def _metric(event: Event | None, name: str) -> float | None:
    """``name`` in ``event``, or the first key holding it (``sparse_categorical_accuracy``)."""
    if event is None:
        return None
    if name in event:
        return _number(event[name])
    keys = [k for k in event if name in k and not k.startswith("val_")]
    return _number(event[keys[0]]) if keys else None


def point_row(
    task: str,
    state: str,
    restarts: int | None,
    events: Sequence[Event],
    *,
    logs: str,
    error: str | None = None,
) -> SweepRow:
    """A row from one array task's state and rank 0's events (``launch`` gives the
    parameters; the last ``eval`` the loss and accuracy, else the last ``progress``;
    ``done`` the final step). ``restarts`` unknown (Slurm forgot the job): counted from
    the ``launch``/``cluster`` events of later attempts."""
    launch = last(events, "launch")
    params = launch.get("params", {}) if launch else {}
    progress, done = last(events, "progress"), last(events, "done")
    evaluation = last(events, "eval")
    scored = evaluation if evaluation is not None else progress
    if restarts is None:
        starts = len(named(events, "launch")) or len(named(events, "cluster"))
        restarts = max(starts - 1, 0)
    step = _int(done.get("step")) if done else None
    if step is None:
        steps = [_int((e or {}).get("step")) for e in (progress, evaluation)]
        step = max((n for n in steps if n is not None), default=None)
    return SweepRow(
        task=task,
        params={str(k): str(v) for k, v in dict(params).items()},
        state=state,
        restarts=restarts,
        step=step,
        total=_int((progress or {}).get("total")),
        loss=_metric(scored, "loss"),
        accuracy=_metric(scored, "accuracy"),
        examples_per_sec=_metric(progress, "examples_per_sec"),
        logs=logs,
        final=is_final(state) or (done is not None and not done.get("preempted")),
        error=error,
    )


def sort_rows(rows: Sequence[SweepRow], key: str | None) -> list[SweepRow]:
    """Rows by ``key`` (a metric column or a parameter), best first: highest accuracy
    and examples/s, lowest loss; rows without the value last. ``None``: task order."""
    if key is None:
        return list(rows)
    names = {n for row in rows for n in row.params}
    if key not in METRICS and key not in names:
        choices = ", ".join([*METRICS, *sorted(names)])
        raise InputError("--sort", key, "is not a column of this sweep", f"one of {choices}")
    descending = key in {"accuracy", "examples_per_sec", "step"}

    def value(row: SweepRow) -> tuple[int, Any]:
        raw: Any = row.params.get(key) if key in names else getattr(row, key)
        if raw is None:
            return (1, 0.0)
        try:
            number = float(raw)
        except (TypeError, ValueError):
            return (0, str(raw))
        return (0, -number if descending else number)

    return sorted(rows, key=value)


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _cells(row: SweepRow, names: Sequence[str]) -> list[str]:
    mark = "" if row.final else "*"
    step = "-" if row.step is None else f"{row.step}/{row.total if row.total else '?'}"
    return [
        row.task,
        *(row.params.get(n, "") for n in names),
        row.state,
        str(row.restarts),
        step + (mark if row.step is not None else ""),
        _fmt(row.loss) + (mark if row.loss is not None else ""),
        _fmt(row.accuracy) + (mark if row.accuracy is not None else ""),
        _fmt(row.examples_per_sec, 1),
        row.logs,
    ]


def param_names(rows: Sequence[SweepRow]) -> list[str]:
    """Parameter names in the order the points give them."""
    names: list[str] = []
    for row in rows:
        names += [n for n in row.params if n not in names]
    return names


def render_table(job_id: str, rows: Sequence[SweepRow]) -> str:
    """Aligned text: a header line, one row per point, an error line under a failed one."""
    names = param_names(rows)
    header = ["task", *names, "state", "restarts", "step", "loss", "accuracy", "ex/s", "logs"]
    table = [header, *(_cells(row, names) for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    finished = sum(row.final for row in rows)
    partial = finished < len(rows)
    title = f"sweep {job_id}: {len(rows)} points, {finished} finished"
    lines = [title + (" (partial: * marks the latest value of a running point)" if partial else "")]
    for cells, row in zip(table, [None, *rows], strict=True):
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
        if row is not None and row.error:
            lines.append(f"    error: {row.error[:300]}")
    return "\n".join(lines)


def render_csv(rows: Sequence[SweepRow]) -> str:
    """CSV with a header: task, each parameter, the metric columns, final, error."""
    names = param_names(rows)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["task", *names, *COLUMNS[1:], "total", "final", "error"])
    for row in rows:
        values: Mapping[str, Any] = row.to_json()
        writer.writerow(
            [row.task, *(row.params.get(n, "") for n in names)]
            + ["" if values[c] is None else values[c] for c in COLUMNS[1:]]
            + ["" if row.total is None else row.total, int(row.final), row.error or ""]
        )
    return out.getvalue()


def render_json(job_id: str, rows: Sequence[SweepRow]) -> str:
    return json.dumps({"job_id": job_id, "points": [r.to_json() for r in rows]}, indent=2)
