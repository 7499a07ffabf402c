"""The succession: what a supervisor that follows another in the same job says and
does of the one before it (:func:`take_over`).

Started again by its keeper, it decides what the end of the one before costs
(:func:`slurmtf.runtime.recovery.decision.after_supervisor`: a restart in place, or a
stop) and ends the steps that one left. Started by a requeue that no one of slurmtf's
asked for while the one before still beat (its node failed: Slurm requeued it), it
records that, with the time of the last beat. Its keeper gone (:mod:`.keeper_death`),
it requeues the job at once (:func:`keeper_died`).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from slurmtf.contracts import EXIT_FAILURE
from slurmtf.runtime.batch_host.heartbeat import Beat
from slurmtf.runtime.batch_host.keeper import Ending
from slurmtf.runtime.batch_host.keeper_death import keeper_gone, watched_keeper
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.runtime.job_log import log, now, stamp
from slurmtf.runtime.recovery.budget import Budget
from slurmtf.runtime.recovery.decision import (
    Decision,
    after_batch_host,
    after_supervisor,
)
from slurmtf.runtime.recovery.endings import signal_name
from slurmtf.runtime.recovery.evidence import LogFiles
from slurmtf.runtime.recovery.record import (
    batch_side_budget,
    err_sizes,
    progress_fields,
    read_record,
    record_batch_side,
    restarts_so_far,
)
from slurmtf.runtime.slurm_calls import (
    end_stale_steps,
    end_steps,
    job_fields,
    requeue,
)
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
    files = LogFiles(job.log_dir, job.logs.prefix, job.logs.suffix, job.srun_err)
    budget = batch_side_budget(files, job.job_id, job.requeues, job.policy)
    decision, line = after_keeper(job, previous, budget)
    if decision.action == "restart":
        end_stale_steps(job.job_id, runner, log, sleep)
    record_batch_side(job.log_dir, job.job_id, budget.so_far, decision, line, kind="supervisor",
                      host=previous.host, lost_at=round(previous.at, 3),
                      ends=err_sizes(files), **progress_fields(budget))  # fmt: skip
    log(line, error=True)
    return None if decision.action == "restart" else decision.status


def after_keeper(job: JobSettings, previous: Ending, budget: Budget) -> tuple[Decision, str]:
    """What the end of the supervisor before costs (``budget``: what it finds)."""
    why = f"{previous.who()} {previous.words()}"
    decision = after_supervisor(why, budget)
    return decision, decision.line(job.job_id, max(0.0, time.time() - previous.at))


KEEPER_SIGNAL_WAIT_S = 2.0  # how long Slurm may take to record the keeper's end


def keeper_signal(job: JobSettings, runner: Runner) -> int:
    """The signal that ended the keeper, from Slurm's ExitCode (``0:9``), which the
    controller may record a moment after the supervisor sees the death (asked again for
    :data:`KEEPER_SIGNAL_WAIT_S` at most); 0 when Slurm does not say."""
    if not job.in_slurm:
        return 0
    deadline = time.monotonic() + KEEPER_SIGNAL_WAIT_S
    while True:
        number = job_fields(job.job_id, runner).get("ExitCode", "").partition(":")[2]
        if number.isdigit() and int(number):
            return int(number)
        if time.monotonic() >= deadline:
            return 0
        time.sleep(0.2)


def after_keeper_death(
    job: JobSettings, keeper: int, at: float, runner: Runner
) -> tuple[Decision, str]:
    """The keeper, the job's own process, is gone (seen at ``at``): Slurm ends the job, so
    the supervisor requeues it at once within the budget (no node left out: its host is
    alive), or stops. The signal that ended the keeper is Slurm's ExitCode (``0:9``)
    when it has it. The decision and its line, recorded (kind ``keeper``)."""
    number = keeper_signal(job, runner)
    by = f" by {signal_name(number)}" if number else ""
    host = job.slurm.nodename or "?"
    why = (
        f"the keeper (pid {keeper} on {host}), the job's own process, was killed{by} at {stamp(at)}"
    )
    files = LogFiles(job.log_dir, job.logs.prefix, job.logs.suffix, job.srun_err)
    budget = batch_side_budget(files, job.job_id, job.requeues, job.policy)
    decision = after_batch_host(why, "", budget)
    line = decision.line(job.job_id)
    if decision.action == "stop":
        line = f"{why}; the job ends: {decision.why}"
    record_batch_side(job.log_dir, job.job_id, budget.so_far, decision, line, kind="keeper",
                      host=host, lost_at=round(at, 3), **progress_fields(budget))  # fmt: skip
    return decision, line


def keeper_died(job: JobSettings, runner: Runner, mark: Callable[[str], None]) -> int:
    """The supervisor after its keeper's death: the decision recorded and said, the
    heartbeat marked (``mark``: ``requeueing`` or ``stopping``), the job's steps ended and
    the job requeued at once; the supervisor's exit status."""
    gone = keeper_gone() or time.time()
    decision, line = after_keeper_death(job, watched_keeper(), gone, runner)
    log(line, error=True)
    if decision.action != "requeue" or not job.in_slurm:  # no queue to go back to
        mark("stopping")
        return decision.status
    mark("requeueing")
    end_steps(job.job_id, runner, watcher_too=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # `scontrol requeue` ends the job
    return 0 if requeue(job.job_id, (), runner, log) else 1


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
