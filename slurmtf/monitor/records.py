"""Where a job's per-rank logs are, from its id alone.

Two sources, in order:

* Slurm, while it knows the job (``scontrol -o show job``): the job scripts put
  ``slurmtf:<log dir>`` in the job's ``Comment``; a job ``slurmtf submit`` made has its
  ``StdOut`` in the log folder (submitit's ``<folder>/<job>_0_log.out``).
* The user's record of submitted jobs, ``$XDG_STATE_HOME/slurmtf/jobs.jsonl``
  (``~/.local/state/slurmtf/jobs.jsonl``): one JSON line per job, appended by
  ``slurmtf submit`` and by the job scripts' supervisor. Each line is one
  ``write`` to a file opened for appending, so concurrent writers do not interleave;
  past :data:`MAX_BYTES` the oldest half is dropped (an atomic rename).

A place is ``(log_dir, pattern)``; ``pattern`` names a rank's file with ``{job}``,
``{rank}`` and ``{kind}`` (``out`` or ``err``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from slurmtf.contracts import SCRIPT_LOG_NAME, SUBMITIT_LOG_NAME

COMMENT_PREFIX = "slurmtf:"
MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class JobPlace:
    """Where a job's logs are and how its rank files are named."""

    job_id: str
    log_dir: Path
    pattern: str
    source: str  # "slurm", "record" or "default"
    model_dir: Path | None = None  # where its summaries are, when the record names it
    params: Mapping[str, str] | None = None  # a sweep point's, when the record names them

    def rank_log(self, rank: int, kind: str = "out") -> Path:
        return self.log_dir / self.pattern.format(job=self.job_id, rank=rank, kind=kind)

    def ranks(self) -> list[int]:
        """Ranks that have a log file, in order."""
        found = []
        rank = 0
        while self.rank_log(rank).exists() or self.rank_log(rank, "err").exists():
            found.append(rank)
            rank += 1
        return found


def record_path(environ: Mapping[str, str] = os.environ) -> Path:
    state = environ.get("XDG_STATE_HOME") or str(Path(environ.get("HOME", "~")) / ".local/state")
    return Path(state).expanduser() / "slurmtf" / "jobs.jsonl"


def append(
    job_id: str,
    log_dir: Path,
    pattern: str,
    name: str = "",
    path: Path | None = None,
    *,
    model_dir: Path | None = None,
    params: Mapping[str, object] | None = None,
) -> None:
    """Add one job to the record (best effort: a read-only home must not fail a submit);
    ``params``: a sweep point's parameters, known before its task starts."""
    path = path or record_path()
    entry = {
        "job_id": job_id,
        "log_dir": str(log_dir),
        "logs": pattern,
        "name": name,
        "time": int(time.time()),
    }
    if model_dir:
        entry["model_dir"] = str(model_dir)
    if params:
        entry["params"] = {str(k): str(v) for k, v in params.items()}
    line = json.dumps(entry)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
        if path.stat().st_size > MAX_BYTES:
            _shrink(path)
    except OSError:
        return


def _shrink(path: Path) -> None:
    """Keep the newest half of the record (whole lines), replacing the file atomically."""
    data = path.read_bytes()
    keep = data[len(data) // 2 :]
    keep = keep[keep.find(b"\n") + 1 :]
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(keep)
    tmp.replace(path)


def lookup(job_id: str, path: Path | None = None) -> JobPlace | None:
    """The newest record of ``job_id`` (``123_4`` is found under ``123_4``)."""
    try:
        lines = (path or record_path()).read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and str(entry.get("job_id")) == job_id:
            model_dir = entry.get("model_dir")
            return JobPlace(
                job_id,
                Path(str(entry["log_dir"])),
                str(entry.get("logs", SCRIPT_LOG_NAME)),
                "record",
                Path(str(model_dir)) if model_dir else None,
            )
    return None


def from_slurm(job_id: str, fields: Mapping[str, str]) -> JobPlace | None:
    """The place named by a ``scontrol show job`` record's ``Comment`` or ``StdOut``."""
    comment = fields.get("Comment", "")
    if comment.startswith(COMMENT_PREFIX):
        return JobPlace(
            job_id, Path(comment.removeprefix(COMMENT_PREFIX)), SCRIPT_LOG_NAME, "slurm"
        )
    stdout = fields.get("StdOut", "")
    if stdout.endswith("_0_log.out"):
        return JobPlace(job_id, Path(stdout).parent, SUBMITIT_LOG_NAME, "slurm")
    return None


def array_tasks(job_id: str, path: Path | None = None) -> dict[int, JobPlace]:
    """The recorded tasks of job array ``job_id`` (ids ``JOB_N``): task -> newest place."""
    try:
        lines = (path or record_path()).read_text(errors="replace").splitlines()
    except OSError:
        return {}
    found: dict[int, JobPlace] = {}
    prefix = f"{job_id}_"
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        task_id = str(entry.get("job_id", ""))
        task = task_id.removeprefix(prefix)
        if task_id.startswith(prefix) and task.isdigit() and "log_dir" in entry:
            pattern = str(entry.get("logs", SCRIPT_LOG_NAME))
            params = entry.get("params")
            found[int(task)] = JobPlace(
                task_id, Path(str(entry["log_dir"])), pattern, "record",
                params={str(k): str(v) for k, v in params.items()}
                if isinstance(params, dict) else None,
            )  # fmt: skip
    return dict(sorted(found.items()))
