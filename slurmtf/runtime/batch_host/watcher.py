"""The job's watcher: one task on a node other than the batch host (``slurmtf watcher``,
which the supervisor starts as an ``srun --overlap`` step:
:mod:`slurmtf.runtime.batch_host.watcher_step`). It reads the supervisor's heartbeat
(:mod:`slurmtf.runtime.batch_host.heartbeat`) and requeues the job when the batch host is
lost.

Every beat it reads the heartbeat file; a write it has not seen is news. After
:data:`~slurmtf.runtime.batch_host.heartbeat.SILENT_BEATS` beats without news it probes the batch
host (a one-task ``srun --overlap`` there, at most ``--probe_s`` seconds):

* the host does not answer: the batch host is lost (dead or hung). Slurm says so only
  at ``SlurmdTimeout``, and under ``--no-kill`` it then keeps the job running on the
  other nodes, without a batch script, until its time limit. The watcher requeues the
  job at once, without that node (``ExcNodeList``), within ``MAX_RESTARTS``;
* the host answers: the supervisor is stopped or hung on a live node. Its keeper ends a
  supervisor that misses :data:`~slurmtf.runtime.batch_host.heartbeat.STUCK_BEATS` beats and starts
  it again in place; the watcher says what it sees and waits. When the heartbeat is
  still silent after :data:`~slurmtf.runtime.batch_host.heartbeat.GIVE_UP_BEATS` beats, the keeper
  is gone too, and the job is requeued without that node all the same.

It never acts for a job that ends or goes back to the queue: it stands down (exits 0)
when the heartbeat says so (``requeueing``, ``stopping``, ``ended``), at SIGTERM (Slurm
signals every step of a job that ends), and when Slurm no longer says RUNNING. Its one
act at SIGTERM is the backstop for a keeper killed with its supervisor
(:meth:`Watcher.backstop`). With the
budget spent it cancels the job rather than leave it holding its nodes. Its lines go to
the job's log, its decision to the job's record (``slurmtf status``, ``slurmtf logs``).
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from slurmtf.runtime import slurm_calls
from slurmtf.runtime.batch_host.heartbeat import (
    GIVE_UP_BEATS,
    QUIET,
    SILENT_BEATS,
    STUCK_BEATS,
    Beat,
    beat_path,
    read_beat,
    write_beat,
)
from slurmtf.runtime.job_log import append, line, now, stamp
from slurmtf.runtime.recovery.budget import DEFAULT_MODE, Budget, Policy
from slurmtf.runtime.recovery.decision import after_batch_host
from slurmtf.runtime.recovery.evidence import LogFiles
from slurmtf.runtime.recovery.record import batch_side_budget, progress_fields, record_batch_side
from slurmtf.slurm.runner import Runner

BACKSTOP_S = 3.0  # how long the watcher leaves a killed keeper's supervisor to act
_QUEUED = ("PENDING", "REQUEUE")  # JobState of a job back in the queue


class _Ended(Exception):
    """SIGTERM: the job ends (Slurm signals every step); the watcher leaves at once."""


@dataclasses.dataclass(frozen=True)
class WatchSettings:
    job_id: str
    log_dir: Path
    host: str  # the batch host
    beat_s: float
    budget: int  # MAX_RESTARTS
    requeues: int  # SLURM_RESTART_COUNT when the job started
    probe_s: float = 10.0
    job_log: Path | None = None  # the job's log, to which the watcher adds its lines
    host_group: int | None = None  # the batch host's component in a heterogeneous job (0)
    mode: str = DEFAULT_MODE  # RESTART_BUDGET: what MAX_RESTARTS counts
    per_hour: int = 0  # MAX_FAILURES_PER_HOUR

    def budget_now(self) -> Budget:
        """The budget a loss of the batch host finds (the record, the ranks' progress)."""
        policy = Policy(self.budget, self.mode, self.per_hour)
        return batch_side_budget(LogFiles(self.log_dir), self.job_id, self.requeues, policy)


@dataclasses.dataclass
class Sight:
    """What the watcher has seen of the heartbeat: the last write and when (its own
    clock: the nodes' clocks need not agree)."""

    last: Beat | None = None
    since: float = 0.0

    def look(self, beat: Beat | None, at: float) -> str:
        """``quiet`` (the job ends or is requeued), ``news`` (a write not seen before)
        or ``silence``."""
        if beat is not None and beat.state in QUIET:
            return "quiet"
        if beat is not None and (self.last is None or beat.seen != self.last.seen):
            self.last, self.since = beat, at
            return "news"
        return "silence"


class Watcher:
    """The watch, from the job's start to its end or a requeue."""

    def __init__(
        self,
        settings: WatchSettings,
        runner: Runner,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.s, self.runner, self.clock, self.sleep = settings, runner, clock, sleep
        self.sight = Sight(since=clock())
        self.told = False  # said that the host answers while its supervisor is silent

    def run(self) -> int:
        signal.signal(signal.SIGTERM, _end)
        path = beat_path(self.s.log_dir, self.s.job_id)
        self.say(f"watching {self.s.host} (the batch host) through {path}", job_log=False)
        risk = slurm_calls.kill_timer_line(self.runner)
        if risk:
            self.say(risk)
        try:
            while True:
                seen = self.sight.look(read_beat(path), self.clock())
                if seen == "quiet":
                    return 0
                if seen == "news" and self.told:
                    self.told = False
                    self.say(f"the supervisor on {self.s.host} beats again")
                if seen == "silence" and self.judge(self.clock() - self.sight.since):
                    return 0
                self.sleep(self.s.beat_s)
        except _Ended:
            return self.backstop()

    def judge(self, silent: float) -> bool:
        """After ``silent`` seconds without news: requeue (True) or wait (False)."""
        if silent < SILENT_BEATS * self.s.beat_s:
            return False
        lost_at = time.time() - silent
        if slurm_calls.probe_dead([self.s.host], self.runner, self.s.probe_s, self.s.host_group):
            why = (f"batch host {self.s.host} lost at {stamp(lost_at)} (the supervisor's last "
                   f"heartbeat; {self.s.host} does not answer a probe)")  # fmt: skip
            return self.requeue(why, lost_at)
        if not self.told:
            self.told = True
            self.say(f"the supervisor on {self.s.host} has not beaten for {silent:.0f} s, but "
                     f"{self.s.host} answers: its keeper ends a supervisor silent for "
                     f"{STUCK_BEATS * self.s.beat_s:g} s and starts it again; the job is "
                     f"requeued after {GIVE_UP_BEATS * self.s.beat_s:g} s")  # fmt: skip
        if silent < GIVE_UP_BEATS * self.s.beat_s:
            return False
        why = (f"the supervisor on {self.s.host} silent since {stamp(lost_at)} while "
               f"{self.s.host} answers (neither it nor its keeper recovered)")  # fmt: skip
        return self.requeue(why, lost_at)

    def requeue(self, why: str, lost_at: float) -> bool:
        """Requeue the job without the batch host, or cancel it with the budget spent;
        True once done (or when the job no longer runs)."""
        state = slurm_calls.job_fields(self.s.job_id, self.runner).get("JobState", "")
        if not state:
            return False  # Slurm did not answer: ask again at the next beat
        if state != "RUNNING":
            self.say(f"the job is {state}: nothing to do", job_log=False)
            return True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # our own requeue signals every step
        budget = self.s.budget_now()
        decision = after_batch_host(why, self.s.host, budget)
        self.mark_requeueing()
        job, host = self.s.job_id, self.s.host
        if decision.action == "stop":
            line = f"{decision.why}; cancelling job {job} at {now()}: it would hold its nodes idle"
        else:
            line = f"{decision.line(job)} at {now()} without {host}"
        record_batch_side(self.s.log_dir, job, budget.so_far, decision, line, kind="batch_host",
                          host=host, lost_at=round(lost_at, 3),
                          **progress_fields(budget))  # fmt: skip
        self.say(line)
        if decision.action == "requeue":
            self.end_steps()
        if decision.action == "stop" or not slurm_calls.requeue(
            job, (host,), self.runner, self.say
        ):
            self.cancel()
            return True
        timeout = slurm_calls.slurmd_timeout(self.runner)
        self.say(f"Slurm holds job {job} (COMPLETING, then PENDING) until it gives {host} up, "
                 f"about SlurmdTimeout ({timeout} s) after {host}'s last answer, then for its "
                 "requeue delay (cred_expire), and starts it again on other nodes")  # fmt: skip
        return True

    def backstop(self) -> int:
        """SIGTERM: the job ends. When its heartbeat still says ``running`` after
        :data:`BACKSTOP_S` (neither the supervisor nor its keeper said why) and Slurm's
        ExitCode says SIGKILL ended the batch step (``0:9``), the keeper and the supervisor
        were killed at once (proctrack/cgroup kills the batch step's whole cgroup when its
        main process dies): the watcher requeues the job within the budget."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        path = beat_path(self.s.log_dir, self.s.job_id)
        deadline = self.clock() + BACKSTOP_S
        while True:
            beat = read_beat(path)
            if beat is None or beat.state not in ("running", "restarting"):
                return 0  # the supervisor said why, or acts itself
            if self.clock() >= deadline:
                break
            self.sleep(0.2)
        fields = slurm_calls.job_fields(self.s.job_id, self.runner)
        code = fields.get("ExitCode", "")
        if code.partition(":")[2] != "9" or fields.get("JobState", "").startswith(_QUEUED):
            return 0  # not killed, or Slurm requeued the job itself (a failed node)
        job, host = self.s.job_id, self.s.host
        budget = self.s.budget_now()
        why = (f"the keeper and the supervisor on {host} were killed (the batch step by "
               f"SIGKILL, ExitCode {code})")  # fmt: skip
        decision = after_batch_host(why, "", budget)
        self.mark_requeueing()
        line = decision.line(job) if decision.action == "requeue" else f"{why}; {decision.why}"
        record_batch_side(self.s.log_dir, job, budget.so_far, decision, line, kind="keeper",
                          host=host, **progress_fields(budget))  # fmt: skip
        self.say(line)
        if decision.action == "requeue":
            slurm_calls.requeue(job, (), self.runner, self.say)
        return 0

    def end_steps(self) -> None:
        """scancel the job's steps but the watcher's own right before the requeue: their
        tasks on the healthy nodes end now, not at the requeue's terminate request, which
        before Slurm 26.05 arms the unkillable-step timer while their stepds still try
        to reach the frozen host's srun (it drained the node 'Kill task failed')."""
        ended = slurm_calls.end_steps(self.s.job_id, self.runner)
        self.say(f"ended the step(s) {','.join(ended) or '-'} before the requeue", job_log=False)

    def mark_requeueing(self) -> None:
        """The heartbeat says ``requeueing``: the job's next start knows it was recorded."""
        path = beat_path(self.s.log_dir, self.s.job_id)
        last = read_beat(path) or self.sight.last
        if last is not None:
            beat = dataclasses.replace(last, count=last.count + 1, time=time.time(),
                                       state="requeueing")  # fmt: skip
            write_beat(path, beat)

    def cancel(self) -> None:
        self.say(f"cancelling job {self.s.job_id}")
        slurm_calls.cancel(self.s.job_id, self.runner)

    def say(self, text: str, *, job_log: bool = True) -> None:
        """A line of the watcher's log and (``job_log``), when it can be reached, of the
        job's log."""
        said = line(f"watcher: {text}")
        print(said, flush=True)
        if job_log and self.s.job_log is not None:
            append(self.s.job_log, said)


def _end(_signum: int, _frame: FrameType | None) -> None:
    raise _Ended
