"""The job's recovery record: one JSON line per restart in place, requeue, stop and
decision about the job's batch side (``recovery-<job>.jsonl`` in the log folder:
:func:`record_path`), which counts the one budget across requeues and which ``slurmtf
status`` and ``slurmtf logs`` show.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slurmtf.runtime.recovery.budget import Budget, Policy, count_budget
from slurmtf.runtime.recovery.decision import Decision
from slurmtf.runtime.recovery.evidence import LogFiles, reached_in_logs

RECORD_NAME = "recovery-{job}.jsonl"


def record_path(log_dir: Path, job_id: str) -> Path:
    return log_dir / RECORD_NAME.format(job=job_id)


def read_record(log_dir: Path, job_id: str) -> list[dict[str, Any]]:
    """The job's decisions so far (restarts in place, requeues, the final stop)."""
    try:
        text = record_path(log_dir, job_id).read_text(errors="replace")
    except OSError:
        return []
    return [r for r in (_json(line) for line in text.splitlines()) if r is not None]


def _json(line: str) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def restarts_so_far(records: Sequence[Mapping[str, Any]], slurm_requeues: int) -> int:
    """Restarts in place + requeues: the recorded ones, plus Slurm's requeues that no
    decision of ours asked for (a node failure Slurm requeued itself)."""
    restarts = sum(1 for r in records if r.get("action") == "restart")
    requeues = sum(1 for r in records if r.get("action") == "requeue")
    return restarts + max(requeues, slurm_requeues)


def batch_side_budget(files: LogFiles, job_id: str, requeues: int, policy: Policy) -> Budget:
    """The budget a decision about the job's batch side finds: the job's record, and how
    far the ranks' logs say training got (its progress since the last failure)."""
    records = read_record(files.log_dir, job_id)
    return count_budget(records, requeues, policy, reached_in_logs(files), time.time())


def progress_fields(budget: Budget) -> dict[str, Any]:
    """What the record keeps of a failure for the budget to count the next one."""
    return {"reached": budget.reached, "progress": budget.progressed}


def write_record(path: Path, record: Mapping[str, Any]) -> None:
    """Append one line (one short write to a file opened for appending)."""
    with path.open("a") as handle:
        handle.write(json.dumps(dict(record)) + "\n")


BATCH_SIDE_KINDS = ("supervisor", "batch_host", "keeper")  # decisions about the job's batch side


def record_batch_side(
    log_dir: Path, job_id: str, attempt: int, decision: Decision, line: str, *, kind: str,
    **extra: Any,
) -> None:  # fmt: skip
    """A decision about the job's batch side (``kind``: ``supervisor``, its own end;
    ``batch_host``, the node it ran on; ``keeper``, the keeper's death) appended to the
    job's record, with ``extra`` (``host``, ``lost_at``, ...): ``slurmtf status`` and
    ``logs`` show its line."""
    record = {"time": round(time.time(), 3), "job_id": job_id, "attempt": attempt}
    record.update(action=decision.action, why=decision.why, status=decision.status)
    record.update(exclude=list(decision.exclude), line=line, kind=kind, **extra)
    write_record(record_path(log_dir, job_id), record)


def batch_side_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The lines of the record's decisions about the job's batch side, in order."""
    return [str(r["line"]) for r in records if r.get("kind") in BATCH_SIDE_KINDS and r.get("line")]


def err_sizes(files: LogFiles) -> dict[str, int]:
    """Where the attempt ended in each rank's error log: what comes before it is an
    earlier attempt's (``slurmtf status`` says so of its last error)."""
    sizes = {}
    for rank in files.ranks():
        try:
            sizes[str(rank)] = files.rank_file(rank, "err").stat().st_size
        except OSError:
            continue
    return sizes


def recovered_attempt(records: Sequence[Mapping[str, Any]], rank: int, offset: int) -> int | None:
    """The attempt a line at ``offset`` of ``rank``'s error log belongs to, when a restart
    or requeue followed that attempt (it was recovered); else ``None``."""
    for record in records:
        ends = record.get("ends") or {}
        end = ends.get(str(rank)) if isinstance(ends, dict) else None
        again = record.get("action") in ("restart", "requeue")
        if again and isinstance(end, int) and offset < end:
            attempt = record.get("attempt")
            return attempt if isinstance(attempt, int) else None
    return None


def in_place(records: Sequence[Mapping[str, Any]]) -> int:
    """How many restarts in place the job's record holds."""
    return sum(1 for r in records if r.get("action") == "restart")
