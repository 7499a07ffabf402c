"""A sweep's points as they stand: Slurm's record of each array task (while it knows
the job), the user's record of submitted jobs and each point's rank 0 log. The I/O edge
of ``slurmtf sweep`` / ``slurmtf status ARRAY_JOB``; the table is :mod:`slurmtf.monitor.sweep_rows`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurmtf.contracts import rank_error_line
from slurmtf.events import last, read_events
from slurmtf.monitor import records as jobrecord
from slurmtf.monitor.records import JobPlace
from slurmtf.monitor.slurm_view import SlurmView, ask_slurm
from slurmtf.monitor.status import locate
from slurmtf.monitor.sweep_rows import SweepRow, point_row
from slurmtf.slurm.runner import Runner

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?(?::(\d+))?$")


def task_ids(spec: str) -> list[int]:
    """Slurm's ``ArrayTaskId`` (``3``, ``2-5``, ``1,4-6%2``, ``0-6:2``) -> task ids."""
    out: list[int] = []
    for part in spec.split("%", maxsplit=1)[0].strip("[]").split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            continue
        low = int(match.group(1))
        high = int(match.group(2) or low)
        out += range(low, high + 1, int(match.group(3) or 1))
    return out


def slurm_tasks(job_id: str, records: Sequence[Mapping[str, str]]) -> dict[int, tuple[str, int]]:
    """Array task -> (state, restarts) from ``scontrol -o show job JOB`` records of
    array ``job_id`` (a plain job, or one task asked for by its own id: ``{}``)."""
    out: dict[int, tuple[str, int]] = {}
    for record in records:
        if record.get("ArrayJobId") != job_id:
            continue
        state = record.get("JobState", "UNKNOWN")
        restarts = record.get("Restarts", "0")
        for task in task_ids(record.get("ArrayTaskId", "")):
            out[task] = (state, int(restarts) if restarts.isdigit() else 0)
    return dict(sorted(out.items()))


def logged_state(place: JobPlace) -> str:
    """A state from rank 0's log once Slurm forgot the job: its launcher's ``exit``."""
    events = read_events(place.rank_log(0))
    ended = last(events, "exit")
    if ended is not None:
        status = ended.get("status")
        return "COMPLETED" if status == 0 else f"FAILED (exit {status})"
    return "UNKNOWN" if events else "PENDING?"


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def point(job_id: str, task: int, slurm: tuple[str, int] | None, place: JobPlace) -> SweepRow:
    """One point's row from its Slurm state (or its log) and its logs."""
    state, restarts = slurm if slurm is not None else (logged_state(place), None)
    error = None
    if not state.startswith("COMPLETED"):
        for rank in place.ranks():
            error = rank_error_line(_read(place.rank_log(rank, "err"))) or None
            if error:
                error = f"rank {rank}: {error}"
                break
    events = read_events(place.rank_log(0))
    if place.params and not any(e.get("event") == "launch" for e in events):
        events.insert(0, {"event": "launch", "params": dict(place.params)})  # not started yet
    return point_row(
        f"{job_id}_{task}",
        state,
        restarts,
        events,
        logs=str(place.rank_log(0)),
        error=error,
    )


def collect(
    job_id: str, runner: Runner, log_dir: str | None = None, view: SlurmView | None = None
) -> list[SweepRow] | None:
    """The rows of array ``job_id``, or ``None`` when it is not a job array. ``view``:
    Slurm's answer when already asked; when the controller did not answer, the rows come
    from the record of submitted jobs and the logs."""
    if not job_id.isdigit():
        return None
    view = view or ask_slurm(job_id, runner)
    slurm = slurm_tasks(job_id, view.records or [])
    recorded = jobrecord.array_tasks(job_id)
    tasks = sorted(set(slurm) | set(recorded))
    if not tasks:
        return None
    rows = []
    for task in tasks:
        place = recorded.get(task) if not log_dir else None
        if place is None:
            silent = view if view.silent else None  # not asked again
            place = locate(f"{job_id}_{task}", runner, log_dir, silent)
        rows.append(point(job_id, task, slurm.get(task), place))
    return rows
