"""The succession: what a supervisor that follows another in the same job says and
does of the one before it (:func:`take_over`).

Started again by its keeper, it decides what the end of the one before costs
(:func:`slurmtf.runtime.recovery.decision.after_supervisor`: a restart in place, or a
stop) and ends the steps that one left. Started by a requeue that no one of slurmtf's
asked for while the one before still beat (its node failed: Slurm requeued it), it
records that, with the time of the last beat.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from slurmtf.contracts import EXIT_FAILURE
from slurmtf.runtime.batch_host.heartbeat import Beat
from slurmtf.runtime.batch_host.keeper import Ending
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.runtime.job_log import log, now
from slurmtf.runtime.recovery.decision import Budget, Decision, after_supervisor
from slurmtf.runtime.recovery.evidence import LogFiles
from slurmtf.runtime.recovery.record import (
    err_sizes,
    read_record,
    record_batch_side,
    restarts_so_far,
)
from slurmtf.runtime.slurm_calls import end_stale_steps
from slurmtf.slurm.runner import Runner


def take_over(
    job: JobSettings,
    previous: Ending | None,
    before: Beat | None,
    runner: Runner,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> int | None:
    """What a supervisor says and does of the one before it in this job (``previous``:
    its keeper's word, ``before``: its last heartbeat); the job's exit status when it
    stops here (the budget is spent), else ``None``."""
    if previous is None:
        line = after_slurm_requeue(job, before)
        if line:
            log(line, error=True)
        return None
    used = restarts_so_far(read_record(job.log_dir, job.job_id), job.requeues)
    decision, line = after_keeper(job, previous, used)
    if decision.action == "restart":
        end_stale_steps(job.job_id, runner, log, sleep)
    files = LogFiles(job.log_dir, job.logs.prefix, job.logs.suffix, job.srun_err)
    record_batch_side(job.log_dir, job.job_id, used, decision, line, kind="supervisor",
                      host=previous.host, lost_at=round(previous.at, 3),
                      ends=err_sizes(files))  # fmt: skip
    log(line, error=True)
    return None if decision.action == "restart" else decision.status


def after_keeper(job: JobSettings, previous: Ending, used: int) -> tuple[Decision, str]:
    """What the end of the supervisor before costs (``used``: restarts so far)."""
    why = f"{previous.who()} {previous.words()}"
    decision = after_supervisor(why, Budget(used, job.budget))
    return decision, decision.line(job.job_id, max(0.0, time.time() - previous.at))


def after_slurm_requeue(job: JobSettings, old: Beat | None) -> str:
    """After a requeue that no decision of slurmtf's recorded, while the supervisor before
    (``old``: its last heartbeat) still beat (``running``): its node failed and Slurm
    requeued the job. The line, recorded; "" for any other start."""
    if not job.requeues or old is None or old.state not in ("running", "restarting"):
        return ""
    records = read_record(job.log_dir, job.job_id)
    if sum(1 for r in records if r.get("action") == "requeue") >= job.requeues:
        return ""
    used = restarts_so_far(records, job.requeues)
    why = (
        f"Slurm requeued job {job.job_id} while {_who(old)} still ran (its last heartbeat "
        f"at {old.clock()}): the batch host {old.host} was lost"
    )
    line = (f"{why}; started again at {now()} on {job.slurm.nodename or '?'} (restart "
            f"{used} of {job.budget}, MAX_RESTARTS)")  # fmt: skip
    decision = Decision("requeue", why, EXIT_FAILURE, (old.host,), used, job.budget)
    record_batch_side(job.log_dir, job.job_id, used - 1, decision, line, kind="batch_host",
                      host=old.host, lost_at=round(old.time, 3))  # fmt: skip
    return line


def _who(beat: Beat) -> str:
    return f"its supervisor (pid {beat.pid} on {beat.host})"
