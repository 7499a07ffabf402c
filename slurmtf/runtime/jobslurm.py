"""What the supervisor and its watcher ask of Slurm itself, each call through the runner
with a bound: ending the steps of a hung node (the watcher's step aside) or of an earlier
supervisor, waiting until Slurm took a node out of the job, requeueing without nodes
(``ExcNodeList``; a node the job asked by name also leaves its ``ReqNodeList``), and the
job's line in the user's record (``slurmtf status|logs JOB`` from any directory).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence

from slurmtf.cluster.hostlists import expand_hostlist
from slurmtf.errors import SlurmtfError
from slurmtf.monitor import records
from slurmtf.runtime.jobsettings import JobSettings
from slurmtf.slurm.runner import Runner
from slurmtf.slurm.scontrol import parse_records, submit_line_nodes

TIMEOUT_S = 30.0
STALE_STEPS_S = 60.0  # the wait for an earlier supervisor's steps to leave Slurm's books
UPDATE_S = 20.0  # scontrol update retried while Slurm says "try again"
WATCHER_NAME = "slurmtf-watcher"  # the watcher's step (srun --job-name)


def _ask(runner: Runner, args: Sequence[str], timeout: float = TIMEOUT_S) -> str:
    """A Slurm command's output, "" when it failed."""
    try:
        return runner(list(args), timeout=timeout)
    except (SlurmtfError, OSError):
        return ""


def job_steps(job_id: str, runner: Runner) -> list[tuple[str, str]]:
    """The job's steps (batch and extern aside) as ``(id, name)``."""
    out = _ask(runner, ["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"], 10)
    steps = [[*line.split(), ""][:2] for line in out.splitlines() if line.split()]
    return [(s, name) for s, name in steps if not s.endswith((".batch", ".extern"))]


def end_steps(job_id: str, runner: Runner, *, watcher_too: bool = False) -> list[str]:
    """scancel the job's steps (batch and extern aside; the watcher's step too only when
    asked): the tasks on the healthy nodes end; the step's srun is ended by the
    supervisor (it would wait for the silent node). The steps cancelled."""
    steps = [s for s, name in job_steps(job_id, runner) if watcher_too or name != WATCHER_NAME]
    if steps:
        _ask(runner, ["scancel", *steps], 10)
    return steps


def end_stale_steps(
    job_id: str, runner: Runner, log: Callable[[str], None], sleep: Callable[[float], None]
) -> None:
    """Before a restarted supervisor's first step: end every step an earlier supervisor of
    this allocation left (its watcher's too) and wait until Slurm lists none, bounded by
    :data:`STALE_STEPS_S` (a step on a silent node stays listed until the node answers)."""
    steps = end_steps(job_id, runner, watcher_too=True)
    if not steps:
        return
    log(f"ending the step(s) {','.join(steps)} the earlier supervisor left")
    deadline = time.monotonic() + STALE_STEPS_S
    while time.monotonic() < deadline and job_steps(job_id, runner):
        sleep(1)


def cancel(job_id: str, runner: Runner) -> None:
    """``scancel`` the job (its watcher, when it may not requeue it)."""
    _ask(runner, ["scancel", job_id], 10)


def job_records(job_id: str, runner: Runner) -> list[dict[str, str]]:
    """``scontrol show job``'s records of this job: one, or one per component of a
    heterogeneous job (records are apart by a blank line; a record's lines are one)."""
    text = _ask(runner, ["scontrol", "show", "job", job_id])
    chunks = [" ".join(chunk.split()) for chunk in text.split("\n\n") if chunk.strip()]
    return [found[0] for found in map(parse_records, chunks) if found]


def job_fields(job_id: str, runner: Runner) -> dict[str, str]:
    """The job's fields (its first component's: the batch host's)."""
    found = job_records(job_id, runner)
    return found[0] if found else {}


def slurmd_timeout(runner: Runner) -> int:
    for line in _ask(runner, ["scontrol", "show", "config"]).splitlines():
        words = line.split()
        if words[:1] == ["SlurmdTimeout"] and len(words) >= 3 and words[2].isdigit():
            return int(words[2])
    return 300


def wait_node_gone(
    job: JobSettings,
    lost: Sequence[str],
    runner: Runner,
    log: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Before requeueing without a node that hangs: wait until Slurm has taken it out of
    the job (at SlurmdTimeout, under --no-kill). Slurm 22.05 gives a job requeued while
    a hung node still holds its old step no generic resources (every srun of it then
    fails with "Invalid generic resource (gres) specification"). Bounded by
    SlurmdTimeout + 60 s."""
    if not lost:
        return
    timeout = slurmd_timeout(runner)
    log(
        f"waiting for Slurm to take node(s) {','.join(lost)} out of the job (SlurmdTimeout "
        f"{timeout} s) before requeueing"
    )
    deadline = time.monotonic() + timeout + 60
    while time.monotonic() < deadline:
        lists = [r.get("NodeList", "") for r in job_records(job.job_id, runner)]
        with contextlib.suppress(SlurmtfError):
            if not set(lost) & {n for text in lists if text for n in expand_hostlist(text)}:
                return
        sleep(2)


def requeue(
    job_id: str,
    exclude: Sequence[str],
    runner: Runner,
    log: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """``scontrol requeue`` (it ends the batch script with SIGTERM: the caller ignores
    it first), then the nodes to avoid added to the job's ExcNodeList and taken out of
    the nodes it asked by name (``sbatch -w``: else it could never start again)."""
    try:
        runner(["scontrol", "requeue", job_id], timeout=TIMEOUT_S)
    except (SlurmtfError, OSError) as exc:
        log(f"scontrol requeue failed: {exc}")
        return False
    if not exclude:
        return True
    fields = job_fields(job_id, runner)
    old = fields.get("ExcNodeList", "")
    avoid = ",".join([old, *exclude] if old and old != "(null)" else exclude)
    _update(job_id, f"ExcNodeList={avoid}", runner, sleep)
    log(f"the restarted job avoids node(s) {avoid}")
    asked = fields.get("ReqNodeList", "")
    if asked and asked != "(null)":
        with contextlib.suppress(SlurmtfError):
            kept = [n for n in expand_hostlist(asked) if n not in exclude]
            if len(kept) < len(expand_hostlist(asked)):
                _update(job_id, f"ReqNodeList={','.join(kept)}", runner, sleep)
                log(f"the restarted job no longer asks for node(s) {','.join(exclude)}")
    return True


def _update(job_id: str, field: str, runner: Runner, sleep: Callable[[float], None]) -> None:
    """``scontrol update JobId=N FIELD``, again for a while when Slurm says to try again
    (a job that lost a node gets a new record first: "the DB index is being set")."""
    args = ["scontrol", "update", f"JobId={job_id}", field]
    deadline = time.monotonic() + UPDATE_S
    while True:
        try:
            runner(args, timeout=TIMEOUT_S)
            return
        except (SlurmtfError, OSError) as exc:
            if "try again" not in str(exc) or time.monotonic() > deadline:
                return
        sleep(1)


def record_job(job: JobSettings, runner: Runner, environ: Mapping[str, str]) -> None:
    """One line per job in the user's record, written at the job's first start; a job
    of the job scripts also names its logs in Slurm's Comment field."""
    if not job.in_slurm or job.requeues:
        return
    if job.kind != "submitit":  # `slurmtf submit` records its jobs itself
        path = records.record_path(environ)
        records.append(
            job.job_id, job.log_dir, job.logs.pattern, job.job_name, path, model_dir=job.model_dir
        )
        comment = f"Comment={records.COMMENT_PREFIX}{job.log_dir}"
        _ask(runner, ["scontrol", "update", f"JobId={job.job_id}", comment], 10)


def range_minimum(job_id: str, allocated: int, runner: Runner) -> str:
    """``MIN_NODES`` when the user set none: the minimum of the job's ``--nodes=MIN-MAX``
    range as ``scontrol show job`` shows it (``SubmitLine=``, Slurm 25.11+), when the job
    got more nodes than that; "" when Slurm does not say (22.05 to 25.05: every node the
    job trains on is then its minimum) or the job asked no range."""
    if not job_id or job_id == "local":
        return ""
    records = parse_records(_ask(runner, ["scontrol", "-o", "show", "job", job_id], 15))
    found = submit_line_nodes(records[0].get("SubmitLine", "")) if records else None
    if found is None or not found[0] < allocated:
        return ""
    return str(found[0])
