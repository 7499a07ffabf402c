"""What the supervisor asks of Slurm itself, each call through the runner with a bound:
ending the steps of a hung node, waiting until Slurm took a node out of the job,
requeueing without nodes (``ExcNodeList``), and the job's line in the user's record
(``slurmtf status|logs JOB`` from any directory).
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


def _ask(runner: Runner, args: Sequence[str], timeout: float = TIMEOUT_S) -> str:
    """A Slurm command's output, "" when it failed."""
    try:
        return runner(list(args), timeout=timeout)
    except (SlurmtfError, OSError):
        return ""


def end_steps(job: JobSettings, runner: Runner) -> None:
    """scancel the job's steps (batch and extern aside): the tasks on the healthy nodes
    end; the step's srun is ended by the supervisor (it would wait for the silent node)."""
    out = _ask(runner, ["squeue", "-h", "-s", "-j", job.job_id, "-o", "%i"], 10)
    steps = [s for s in out.split() if not s.endswith((".batch", ".extern"))]
    if steps:
        _ask(runner, ["scancel", *steps], 10)


def job_fields(job: JobSettings, runner: Runner) -> dict[str, str]:
    """``scontrol show job``'s fields of this job (its lines read as one record)."""
    text = _ask(runner, ["scontrol", "show", "job", job.job_id])
    found = parse_records(" ".join(text.split()))
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
        nodes = job_fields(job, runner).get("NodeList", "")
        with contextlib.suppress(SlurmtfError):
            if not set(lost) & set(expand_hostlist(nodes) if nodes else ()):
                return
        sleep(2)


def requeue(
    job: JobSettings, exclude: Sequence[str], runner: Runner, log: Callable[[str], None]
) -> bool:
    """``scontrol requeue`` (it ends the batch script with SIGTERM: the caller ignores
    it first), then the nodes to avoid added to the job's ExcNodeList."""
    try:
        runner(["scontrol", "requeue", job.job_id], timeout=TIMEOUT_S)
    except (SlurmtfError, OSError) as exc:
        log(f"scontrol requeue failed: {exc}")
        return False
    if exclude:
        old = job_fields(job, runner).get("ExcNodeList", "")
        avoid = ",".join([old, *exclude] if old and old != "(null)" else exclude)
        _ask(runner, ["scontrol", "update", f"JobId={job.job_id}", f"ExcNodeList={avoid}"])
        log(f"the restarted job avoids node(s) {avoid}")
    return True


def record_job(job: JobSettings, runner: Runner, environ: Mapping[str, str]) -> None:
    """One line per job in the user's record, written at the job's first start; a job
    of the job scripts also names its logs in Slurm's Comment field."""
    if not job.in_slurm or job.requeues:
        return
    if job.kind != "submitit":  # `slurmtf submit` records its jobs itself
        path = records.record_path(environ)
        records.append(job.job_id, job.log_dir, job.logs.pattern, job.job_name, path)
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
