"""What a job's own files say, without Slurm: the status its script or rank 0 ended with,
the final accuracy, each rank's last error line, the list of its log files. Read by
``slurmtf status``, the ``--wait`` follower and, when the controller does not answer,
instead of Slurm (:mod:`slurmtf.monitor.status`).
"""

from __future__ import annotations

from pathlib import Path

from slurmtf.contracts import rank_error_line
from slurmtf.events import Event, last, named, read_events
from slurmtf.monitor.records import JobPlace
from slurmtf.runtime.recovery.record import read_record, recovered_attempt


def recorded_status(folder: Path, job_id: str) -> int | None:
    """The status the job's script ended with, from its recovery record (a stop), if any."""
    stops = [r for r in read_record(folder, job_id) if r.get("action") == "stop"]
    status = stops[-1].get("status") if stops else None
    return status if isinstance(status, int) else None


def logged_exit(path: Path) -> int | None:
    """The status in the last ``{"event": "exit"}`` line of a rank's log, if any."""
    event = last(read_events(path), "exit")
    if event is None:
        return None
    value = event.get("status", 1)
    return int(value) if isinstance(value, int | str) else 1


def final_accuracy(path: Path) -> tuple[float, object] | None:
    """Accuracy and step of the last ``eval`` event in the chief's log."""
    found = None
    for event in named(read_events(path), "eval"):
        keys = [k for k in event if "accuracy" in k]
        key = "accuracy" if "accuracy" in event else (keys[0] if keys else None)
        value = event.get(key) if key is not None else None
        if isinstance(value, int | float):
            found = (float(value), event.get("step"))
    return found


def read_new(path: Path, offset: int) -> tuple[list[str], int]:
    """The whole lines ``path`` gained since ``offset``, and the new offset."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    return data[:end].decode(errors="replace").splitlines(), offset + end


def last_error_at(path: Path) -> tuple[str, int] | None:
    """The line of a rank's stderr that says what went wrong (``rank_error_line``) and
    the byte offset where it starts."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    line = rank_error_line(text)
    if not line:
        return None
    return line, len(text[: text.rfind(line)].encode())


def error_lines(place: JobPlace, records: list[Event]) -> list[str]:
    """Each rank's last error line; one from an attempt that a restart or requeue
    followed says so (``recovered``)."""
    lines = []
    for rank in place.ranks():
        found = last_error_at(place.rank_log(rank, "err"))
        if not found:
            continue
        error, offset = found
        attempt = recovered_attempt(records, rank, offset)
        where = f" (attempt {attempt}, recovered)" if attempt is not None else ""
        lines.append(f"  last error, rank {rank}{where}: {error[:300]}")
    return lines


SHOWN_RANKS = 8  # status lists this many ranks' files, then a count


def log_lines(place: JobPlace) -> list[str]:
    """Each rank's real log files (the first ``SHOWN_RANKS``), and how they were found."""
    ranks = place.ranks()
    lines = [f"  logs ({len(ranks)} rank(s) in {place.log_dir}, found via {place.source}):"]
    for rank in ranks[:SHOWN_RANKS] or [0]:
        missing = "" if ranks else " (not written yet)"
        lines.append(
            f"    rank {rank}: {place.rank_log(rank)}  {place.rank_log(rank, 'err')}{missing}"
        )
    if len(ranks) > SHOWN_RANKS:
        lines.append(f"    ... and {len(ranks) - SHOWN_RANKS} more rank(s) in {place.log_dir}")
    return lines
