"""The supervisor's side of a job that outlives its batch host and its supervisor.

The batch host runs the batch script: the keeper (:mod:`slurmtf.runtime.keeper`) and the
supervisor. Nothing on that node can act when the node itself is lost, so the supervisor
beats (:mod:`slurmtf.runtime.heartbeat`) for a watcher on another node of the job
(:mod:`slurmtf.runtime.watcher`), which requeues the job without the node. Here:

* :class:`WatcherStep`: the watcher as a one-task ``srun --overlap`` step (no resources
  of its own: it shares those of the job's other steps), named ``slurmtf-watcher``, on
  the last node of the job that is not the batch host (the spare, when the job keeps
  one; in a heterogeneous job, a node of another component when the batch host's is a
  single node). It starts with the supervisor, starts again on another node when its
  node is left out or it ends (at most :data:`WATCHER_STARTS` times), and ends with the
  supervisor. A one-node job has no other node: there Slurm itself requeues the job
  when it declares the node failed (``SlurmdTimeout``), ``--no-kill`` or not.
* :func:`take_over`: a supervisor that follows another in the same job says what became
  of it. Started again by its keeper, it decides what the end of the one before costs
  (:func:`slurmtf.runtime.recovery.decision.after_supervisor`: a restart in place, or a stop)
  and ends the steps that one left. Started by a requeue that no one of slurmtf's asked
  for while the one before still beat (its node failed: Slurm requeued it), it records
  that, with the time of the last beat.
* :func:`after_keeper_death`: the keeper is gone (``slurmtf.runtime.keeper_death``): the
  decision to requeue the job at once, recorded.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from slurmtf.cluster.hostlists import expand_hostlist
from slurmtf.contracts import EXIT_FAILURE
from slurmtf.runtime.children import Child
from slurmtf.runtime.heartbeat import Beat
from slurmtf.runtime.joblog import log, now, stamp
from slurmtf.runtime.jobsettings import JobSettings
from slurmtf.runtime.keeper import Ending
from slurmtf.runtime.keeper_death import keeper_gone, watched_keeper
from slurmtf.runtime.placement import allocated_nodes
from slurmtf.runtime.recovery.decision import (
    Budget,
    Decision,
    after_batch_host,
    after_supervisor,
)
from slurmtf.runtime.recovery.endings import signal_name
from slurmtf.runtime.recovery.evidence import LogFiles
from slurmtf.runtime.recovery.record import (
    err_sizes,
    read_record,
    record_batch_side,
    restarts_so_far,
)
from slurmtf.runtime.slurm_calls import (
    WATCHER_NAME,
    end_stale_steps,
    end_steps,
    job_fields,
    one_task_step,
    requeue,
)
from slurmtf.slurm.runner import Runner

WATCHER_STARTS = 5  # in one allocation; then the job goes on unwatched, with a line
WATCHER_LOG = "watcher-{job}.out"


@dataclasses.dataclass(frozen=True)
class WatcherPlace:
    node: str
    group: int | None = None  # the heterogeneous job's component (srun --het-group)


def watcher_place(job: JobSettings, host: str, left_out: Sequence[str] = ()) -> WatcherPlace | None:
    """The last node of the job, in Slurm's order, that is neither the batch host nor
    left out (``None``: there is none, as in a one-node job)."""
    lists = job.slurm.het_nodelists if job.het_size > 1 else ()
    nodes: list[tuple[str, int | None]] = [(n, None) for n in allocated_nodes(job)]
    if lists:
        nodes = [(n, k) for k, text in enumerate(lists) if text for n in expand_hostlist(text)]
    usable = [(n, k) for n, k in nodes if n != host and n not in left_out]
    return WatcherPlace(*usable[-1]) if usable else None


def watcher_log(job: JobSettings) -> Path:
    return job.log_dir / WATCHER_LOG.format(job=job.job_id)


def watcher_args(
    job: JobSettings, place: WatcherPlace, host: str, job_log: Path | None
) -> list[str]:
    """srun's arguments for the watcher step, with the interpreter that runs the
    supervisor (outside any container prefix, as slurmtf's own steps)."""
    out = watcher_log(job)
    return [
        *one_task_step(place.node, place.group), f"--job-name={WATCHER_NAME}", "--input=none",
        f"--output={out}", f"--error={out}", "--open-mode=append",
        sys.executable, "-m", "slurmtf.cli", "watcher",
        f"--job_id={job.job_id}", f"--log_dir={job.log_dir}", f"--host={host}",
        f"--heartbeat_s={job.beat_s:g}", f"--max_restarts={job.budget}",
        f"--requeues={job.requeues}", f"--probe_s={job.probe_s:g}",
        *([f"--job_log={job_log}"] if job_log is not None else []),
        *(["--host_group=0"] if job.het_size > 1 else []),  # the batch host's component
    ]  # fmt: skip


def job_log_path() -> Path | None:
    """The job's log (the batch script's stdout, a file Slurm opened), to which the
    watcher adds its lines; ``None`` when stdout is no file."""
    try:
        path = Path(f"/proc/{os.getpid()}/fd/1").readlink()
    except OSError:
        return None
    return path if path.is_absolute() and path.is_file() else None


class WatcherStep:
    """The watcher's step, kept running while the supervisor runs."""

    def __init__(self, job: JobSettings, env: Mapping[str, str]) -> None:
        self.job, self.env = job, dict(env)
        self.host = job.slurm.nodename or ""
        self.job_log = job_log_path()
        self.child: Child | None = None
        self.place: WatcherPlace | None = None
        self.starts = 0
        self.told = False

    @property
    def wanted(self) -> bool:
        return self.job.in_slurm and self.job.watcher and bool(self.host)

    def keep(self, left_out: Sequence[str] = ()) -> None:
        """Start the watcher, or start it again when it ended or its node is left out."""
        if not self.wanted:
            return
        running = self.child is not None and self.child.poll() is None
        if running and self.place is not None and self.place.node not in left_out:
            return
        if self.child is not None:
            self.child.stop(grace=0)
            self.child = None
        place = watcher_place(self.job, self.host, left_out)
        if place is None or self.starts >= WATCHER_STARTS:
            self._tell(place is None)
            return
        again = " again" if self.starts else ""
        log(f"watcher{again} on {place.node}: requeues the job if {self.host} (the batch "
            f"host) stops answering (heartbeat every {self.job.beat_s:g} s)")  # fmt: skip
        self.place = place
        self.child = Child(watcher_args(self.job, place, self.host, self.job_log), self.env,
                           stderr=watcher_log(self.job))  # fmt: skip
        self.starts += 1

    def stop(self, *, at_once: bool = False) -> None:
        """End the watcher's srun (``at_once``: SIGKILL, which signals no step)."""
        if self.child is not None:
            self.child.stop(grace=0 if at_once else 2)
            self.child = None

    def _tell(self, alone: bool) -> None:
        if self.told:
            return
        self.told = True
        if alone:
            log(f"no other node watches {self.host} (the batch host): if it is lost, Slurm "
                "requeues the job when it declares the node failed (SlurmdTimeout)")  # fmt: skip
        else:
            log(f"the watcher was started {WATCHER_STARTS} times: the job goes on unwatched")


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


def after_keeper_death(
    job: JobSettings, keeper: int, at: float, runner: Runner
) -> tuple[Decision, str]:
    """The keeper, the job's own process, is gone (seen at ``at``): Slurm ends the job, so
    the supervisor requeues it at once within the budget (no node left out: its host is
    alive), or stops. The signal that ended the keeper is Slurm's ExitCode (``0:9``)
    when it has it. The decision and its line, recorded (kind ``keeper``)."""
    code = job_fields(job.job_id, runner).get("ExitCode", "") if job.in_slurm else ""
    number = code.partition(":")[2]
    by = f" by {signal_name(int(number))}" if number.isdigit() and int(number) else ""
    host = job.slurm.nodename or "?"
    why = (
        f"the keeper (pid {keeper} on {host}), the job's own process, was killed{by} at {stamp(at)}"
    )
    used = restarts_so_far(read_record(job.log_dir, job.job_id), job.requeues)
    decision = after_batch_host(why, "", Budget(used, job.budget))
    line = decision.line(job.job_id)
    if decision.action == "stop":
        line = f"{why}; the job ends: {decision.why}"
    record_batch_side(job.log_dir, job.job_id, used, decision, line, kind="keeper",
                      host=host, lost_at=round(at, 3))  # fmt: skip
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
