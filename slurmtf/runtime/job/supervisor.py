"""The supervisor of a batch job: one process, one loop, from the first step to the job's
exit status (``slurmtf job KIND ...``, which every job script hands over to).

As torch.distributed.elastic's agent (``SimpleElasticAgent._invoke_run``) it starts the
step, looks at it every ``SLURMTF_NODE_WATCH_S`` seconds and, when it ends, applies the
restart policy (:func:`slurmtf.runtime.recovery.decision.decide`, through
:func:`slurmtf.runtime.recovery.after_step.decide_and_record`)::

    all tasks exit 0                    -> the job ends COMPLETED (exit 0)
    preempted (exit 75 after a save)    -> requeue (same job id), resume from the checkpoint
    a rank died, a peer was lost, a     -> restart in place: a new srun step in the same
    stall, a node is gone                  allocation, a silent node left out (--exclude),
                                           its place taken by a spare or the nodes left
    bad flags (exit 2), a model error   -> no retry; the last line says why

While a step runs, the ranks' ``peer_lost`` events name nodes to probe (the ranks of a
node append them to that node's file, :mod:`slurmtf.events`: a look at the step opens one
file per node, however many ranks each runs); one that does not answer ends the step at
once (its srun would wait for it until Slurm's SlurmdTimeout). Every srun is a child in
its own process group, ended with bounded waits (:mod:`slurmtf.runtime.job.children`);
USR1/USR2 reaching the supervisor go on to the running step (srun forwards them to the
ranks); SIGTERM (the job cancelled) ends the step and the job.

The supervisor is the child of the batch script's own process, its keeper
(:mod:`slurmtf.runtime.batch_host.keeper`), which starts it again when it dies. It beats
every ``SLURMTF_HEARTBEAT_S`` seconds (:mod:`slurmtf.runtime.batch_host.heartbeat`) for
its keeper and for a watcher step on another node, which requeues the job when the batch
host is lost (:mod:`slurmtf.runtime.batch_host.watcher_step`,
:mod:`slurmtf.runtime.batch_host.watcher`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from slurmtf.cluster.step_flags import het_task_counts
from slurmtf.events import NODE_EVENTS_VAR, Event, named, node_events_path
from slurmtf.monitor import records
from slurmtf.monitor.tracker_runs import job_run_env
from slurmtf.runtime import slurm_calls
from slurmtf.runtime.batch_host.heartbeat import Beat, Heartbeat, beat_path, read_beat
from slurmtf.runtime.batch_host.keeper import Ending
from slurmtf.runtime.batch_host.keeper_death import keeper_gone
from slurmtf.runtime.batch_host.succession import keeper_died, take_over
from slurmtf.runtime.batch_host.watcher_step import WatcherStep
from slurmtf.runtime.job.beacon import Beacon
from slurmtf.runtime.job.check_first import CheckFirst
from slurmtf.runtime.job.children import Child
from slurmtf.runtime.job.commands import RankCommand, find_model, rank_command
from slurmtf.runtime.job.follow import Copier, EventFollower, sizes
from slurmtf.runtime.job.settings import MODEL_KINDS, TRACKED_KINDS, JobSettings
from slurmtf.runtime.job.srun_flags import cpus_note, gpu_bind, resv_ports, step_tasks
from slurmtf.runtime.job.staging import Staging
from slurmtf.runtime.job.step_nodes import (
    Placement,
    allocated_nodes,
    every_node,
    first_placement,
    next_placement,
)
from slurmtf.runtime.job.warm import (
    Standby,
    go_path,
    moved_step_name,
    standby_env,
    trains,
    warm_delay,
    warm_now,
)
from slurmtf.runtime.job_log import log, plain, to_stderr
from slurmtf.runtime.recovery.after_step import Step, decide_and_record
from slurmtf.runtime.recovery.decision import Decision, restart_without
from slurmtf.runtime.recovery.evidence import (
    LogFiles,
    glob_escape,
    lost_in,
    probe_lost,
    survivors_saved,
)
from slurmtf.runtime.recovery.node_choice import Nodes
from slurmtf.runtime.recovery.record import read_record, restarts_so_far
from slurmtf.slurm.resv_ports import cluster_span
from slurmtf.slurm.runner import Runner

FORWARDED = (signal.SIGUSR1, signal.SIGUSR2)
USURPED = (
    "the job went on without this supervisor (requeued while this one was stopped): it "
    "stops here and asks Slurm nothing"
)


@dataclasses.dataclass
class StepEnd:
    status: int
    lost: tuple[str, ...] = ()  # silent nodes for which the step was ended
    alive: tuple[str, ...] = ()  # nodes that answered a probe during the step


class Supervisor:
    """Runs the job's steps until it is done, requeued or stopped."""

    def __init__(
        self,
        job: JobSettings,
        args: Sequence[str],
        env: Mapping[str, str],
        runner: Runner,
        *,
        pipe: int = -1,
        previous: Ending | None = None,
    ) -> None:
        self.job, self.args, self.runner = job, list(args), runner
        self.env = dict(env)
        self.child: Child | None = None
        self.terminated = False
        self.requeued = False
        self.finished = False
        self.previous = previous  # how the supervisor before this one ended (its keeper's word)
        self.before: Beat | None = None
        base = Beat(job.job_id, job.slurm.nodename or "", os.getpid(), os.getppid(), 0, 0.0)
        self.beats = Heartbeat(beat_path(job.log_dir, job.job_id), base, job.beat_s,
                               self.beat_state, pipe)  # fmt: skip
        self.watcher = WatcherStep(job, env)
        self.attempt = 0
        self.nodes = Nodes()
        self.place = Placement()
        self.staging = Staging(job, self.env, runner)
        self.files = LogFiles(job.log_dir, job.logs.prefix, job.logs.suffix, job.srun_err)
        self.resv_span: int | None = None  # MpiParams=ports' range, asked once
        self.standby: Standby | None = None  # the next attempt's warm ranks (runtime.job.warm)
        self.failed = False  # an attempt of this job failed (SLURMTF_WARM_STANDBY=auto)

    # --- the loop -----------------------------------------------------------------
    def run(self, header: bool = True) -> int:
        """The job from its first step to its exit status."""
        before = {s: signal.getsignal(s) for s in (*FORWARDED, signal.SIGTERM)}
        self._install_signals()
        self.job.log_dir.mkdir(parents=True, exist_ok=True)
        self.before = read_beat(self.beats.path)  # the supervisor before this one's last word
        self.beats.start()
        try:
            status = self.supervise(header)
            self.finished = True
            return status
        finally:
            self.stop_standby()
            self.watcher.stop(at_once=self.beats.usurped)
            self.beats.stop()
            for signum, handler in before.items():
                if not (self.requeued and signum == signal.SIGTERM):  # requeue: Slurm's TERM
                    signal.signal(signum, handler)

    def beat_state(self) -> str:
        """What the heartbeat says of this supervisor (slurmtf.runtime.batch_host.heartbeat)."""
        if self.requeued:
            return "requeueing"
        if self.terminated:
            return "stopping"
        return "ended" if self.finished else "running"

    def supervise(self, header: bool) -> int:
        self.job.model_dir.mkdir(parents=True, exist_ok=True)
        stopped = take_over(self.job, self.previous, self.before, self.runner)
        if stopped is not None:
            return stopped
        self.attempt = restarts_so_far(
            read_record(self.job.log_dir, self.job.job_id), self.job.requeues
        )
        self.beats.attempt = self.attempt
        minimum = ""
        if not (self.job.min_nodes or self.job.spare_nodes):  # Slurm 25.11+ says the range's
            count = len(allocated_nodes(self.job))
            minimum = slurm_calls.range_minimum(self.job.job_id, count, self.runner)
        self.nodes, self.place = first_placement(self.job, minimum)
        record_job(self.job, self.runner, self.env)
        if header:
            plain(job_header(self.job, self.attempt))
            self.announce()
        shared = cpus_note(self.job, self.place.tasks)
        if shared:
            log(shared)
        self.watcher.keep()
        checked = self.check_first()
        if checked is not None:
            return checked
        self.staging.stage(self.args)
        while True:
            end = None if self.terminated or keeper_gone() else self.run_step()
            if keeper_gone() is not None:
                return self.after_keeper()
            if self.beats.usurped:
                log(USURPED, error=True)
                return 1
            if end is None or self.terminated:  # Slurm ends the job: nothing to decide
                log("the job was ended (SIGTERM): its step was stopped", error=True)
                return 128 + signal.SIGTERM
            decision, line = self.decide(end)
            outcome = self.follow(decision, line, end)
            if outcome is not None:
                return outcome

    def announce(self) -> None:
        """What the job runs, once: the model found, or the script and the roles."""
        if self.job.kind in MODEL_KINDS:
            plain(f"model {find_model(self.job, self.env)}")
        elif self.job.kind == "train":
            print(f"running {' '.join(self.args)}", flush=True)
        elif self.job.kind == "parameter_server":
            print(f"running {' '.join(self.args)} on the chief; roles {self.job.roles}", flush=True)

    def follow(self, decision: Decision, line: str, end: StepEnd) -> int | None:
        """Act on a decision: the job's exit status, or None after placing the next step."""
        if decision.note:
            log(decision.note)
        if decision.action != "restart":
            self.stop_standby()  # the job ends or goes back to the queue
        if decision.action == "done":
            if decision.why != "completed":
                log(line)
            self.staging.unstage()
            return 0
        if decision.action == "restart":
            log(line)
            self.failed = True
            self.attempt = self.beats.attempt = decision.restart
            self.place = next_placement(self.job, self.place, decision)
            self.watcher.keep(self.place.excluded)
            return None
        if decision.action == "requeue":
            log(line)
            if self.requeue(decision, end.lost):
                return 0
            self.staging.unstage()  # not when requeued: a restart on this node reuses the copy
            return decision.status
        log(line, error=True)
        self.staging.unstage()
        return decision.status

    def decide(self, end: StepEnd, outliers: Sequence[str] = ()) -> tuple[Decision, str]:
        step = Step(
            self.job.job_id, end.status, self.job.budget, self.job.requeues,
            dataclasses.replace(self.nodes, excluded=self.place.excluded), self.job.probe_s,
            tuple(outliers), " ".join(self.job.python), dead=end.lost, alive=end.alive,
            in_place=self.job.in_place, mode=self.job.budget_mode,
            per_hour=self.job.failures_per_hour,
        )  # fmt: skip
        return decide_and_record(step, self.files, self.runner)

    def requeue(self, decision: Decision, lost: Sequence[str]) -> bool:
        slurm_calls.wait_node_gone(self.job.job_id, lost, self.runner, log)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # `scontrol requeue` ends the script
        self.requeued = True
        self.beats.now()  # the watcher stands down
        return slurm_calls.requeue(self.job.job_id, decision.exclude, self.runner, log)

    def after_keeper(self) -> int:
        """The keeper is gone: the job is requeued at once (``succession.keeper_died``)."""
        return keeper_died(self.job, self.runner, self._mark)

    def _mark(self, state: str) -> None:
        self.requeued, self.terminated = state == "requeueing", state != "requeueing"
        self.beats.now()  # the watcher stands down

    # --- one step -----------------------------------------------------------------
    def step_args(self, command: RankCommand, placement: Placement | None = None) -> list[str]:
        """srun's arguments for this attempt's step (on ``placement``: this attempt's)."""
        chosen = placement or self.place
        place = chosen.flags
        resv = self.resv_ports(place)
        if self.job.kind == "submitit":
            return ["srun", *chosen.args, *resv, *self.job.srun_args, *command.srun_args,
                    *command.args]  # fmt: skip
        het = [f"--het-group=0-{self.job.het_size - 1}"] if self.servers_het(command) else []
        logs = [
            f"--output={self.job.rank_file('%t', 'out')}",
            f"--error={self.job.rank_file('%t', 'err')}",
        ]
        bind = gpu_bind(self.job, chosen.per_node)
        return [
            "srun", f"--kill-on-bad-exit={command.kill_on_bad_exit}", "--open-mode=append",
            *place, *bind, *resv, *het, *self.job.srun_args, *logs, *command.args,
        ]  # fmt: skip

    def servers_het(self, command: RankCommand) -> bool:
        """A parameter-server step of a heterogeneous job spans every component."""
        return self.job.het_size > 1 and not command.kill_on_bad_exit

    def resv_ports(self, place: Sequence[str]) -> list[str]:
        """Slurm's reserved ports for the step (slurmtf.slurm.resv_ports): one per rank,
        where the cluster has MpiParams=ports (or SLURMTF_RESV_PORTS=1); none in a
        heterogeneous job (each component would get ports the other's ranks cannot know)."""
        if self.job.het_size > 1 or self.job.resv_mode is False:
            return []
        if self.resv_span is None:
            self.resv_span = cluster_span(self.runner) if self.job.in_slurm else 0
        return resv_ports(self.job, place, self.resv_span)

    def step_env(self, command: RankCommand, attempt: int) -> dict[str, str]:
        """The ranks' environment for ``attempt``: they see its number as
        SLURM_RESTART_COUNT (restarts in place + requeues), so that their events and
        checkpoints name it."""
        env = {**self.env, **command.env, **self.staging.env()}
        if self.servers_het(command):  # each component's own task count (Slurm 26.05)
            env.update(het_task_counts(env))
        if attempt:
            env["SLURM_RESTART_COUNT"] = str(attempt)
        env[NODE_EVENTS_VAR] = self.job.node_events  # SLURMTF_NODE_EVENTS
        return env

    def tracker_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """SLURMTF_MLFLOW_RUN_ID and SLURMTF_MLFLOW_LAST_STEP, asked at each start."""
        return job_run_env(env, log) if self.job.kind in TRACKED_KINDS else {}

    def run_step(self) -> StepEnd:
        """One attempt of the step: a new srun, or the warm one made for it."""
        command = rank_command(self.job, self.args, self.job.requeues)
        env = self.step_env(command, self.attempt)
        tracked = self.tracker_env(env)
        env.update(tracked)
        if command.done_file is not None:
            with contextlib.suppress(OSError):
                command.done_file.unlink()
        ends = sizes([*self._log_paths(), *self._node_files()])
        self.files = LogFiles(self.job.log_dir, self.job.logs.prefix, self.job.logs.suffix,
                              self.job.srun_err, ends)  # fmt: skip
        copy = (
            None
            if self.job.kind == "submitit"
            else Copier(
                self.job.srun_err, self.files.offsets.get(str(self.job.srun_err), 0), to_stderr
            )
        )
        self.child = self.warm_child(tracked)
        if self.child is None:
            self.child = Child(
                self.step_args(command), env, stderr=None if copy is None else self.job.srun_err
            )
        beacon = self.start_beacon()
        try:
            end = self.watch(copy, command, beacon)
        finally:
            if beacon is not None:
                beacon.stop()
            self.child.reap()
            if copy is not None:
                copy.copy()
            self.child = None
            for moved in (False, True):  # the word that started this attempt's ranks
                go = go_path(self.job.log_dir, self.job.job_id, self.attempt, moved=moved)
                with contextlib.suppress(OSError):
                    go.unlink()
        plain(f"srun exited {end.status}")
        return end

    def start_beacon(self) -> Beacon | None:
        """The nodes' beacon for this attempt (slurmtf.runtime.job.beacon), where the
        supervisor watches the nodes of a job of several."""
        nodes = [n for n in every_node(self.job) if n not in self.place.excluded]
        usable = self.job.node_watch and self.job.in_slurm and self.job.het_size <= 1
        return Beacon(nodes, self.env) if usable and len(nodes) > 1 else None

    def watch(self, copy: Copier | None, command: RankCommand, beacon: Beacon | None) -> StepEnd:
        """Until the step ends: copy srun's messages, read the ranks' new events; when
        one names a lost peer, ask the beacon about its node, else probe it; a silent one
        ends the step at once. The next attempt's warm ranks start after the chief's
        first step."""
        assert self.child is not None
        follower = EventFollower(self._node_files, dict(self.files.offsets))
        watching = self.job.node_watch and self.job.in_slurm
        due = self.warm_due(command)  # None: no warm ranks for the next attempt
        warmable = due is not None
        seen = False  # the chief's first step of this attempt
        alive: tuple[str, ...] = ()
        reports: list[Event] = []  # the ranks' peer_lost events of this attempt
        started = time.monotonic()
        while self.child.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.child.proc.wait(timeout=self.job.watch_s)
            if copy is not None:
                copy.copy()
            if self.terminated:
                return StepEnd(self.child.stop())
            if self.beats.usurped:  # SIGKILL: srun would signal a step of the job's next start
                return StepEnd(self.child.stop(grace=0))
            if keeper_gone() is not None:  # Slurm ends the job: its steps go now
                return StepEnd(self.child.stop(grace=0))
            self.watcher.keep(self.place.excluded)
            news = follower.new_events() if watching or due is not None else []
            seen = seen or trains(news)
            if due is not None and warm_now(due, seen, time.monotonic() - started):
                due = None
                self.start_standby(command)
            quiet = beacon.quiet() if beacon is not None and warmable else ()
            if quiet:
                due = None  # the warm step, if any, moves to where the next attempt runs
                self.warm_elsewhere(command, quiet)
            if not watching:
                continue
            said = lost_in(news, self.files.new_text(self.job.srun_err) if news else "")
            reports += named(news, "peer_lost")
            if not said:
                continue
            nodes = dataclasses.replace(self.nodes, excluded=self.place.excluded)
            silent = None if beacon is None else beacon.silent
            lost, alive = probe_lost(
                said, nodes, alive, self.runner, self.job.probe_s, silent=silent
            )
            if lost:
                heard = "" if beacon is None else beacon.silences(lost)
                how = f" ({heard}: the nodes' beacon)" if heard else ""
                log(f"node(s) {','.join(lost)} stopped answering{how}: ending the step "
                    "without waiting for Slurm (SlurmdTimeout)", error=True)  # fmt: skip
                saved = survivors_saved(self.files, reports, lost)  # no grace needed
                grace = 0.0 if saved else slurm_calls.TERM_GRACE_S
                keep = [self.standby.name] if self.standby and self.standby.name else []
                slurm_calls.end_steps(self.job.job_id, self.runner, grace_s=grace, keep=keep)
                if beacon is not None:  # its step spans the lost node, and ended above
                    beacon.stop(at_once=True)
                return StepEnd(self.child.stop(grace=0), lost, alive)
        return StepEnd(self.child.status(), (), alive)

    # --- warm ranks (slurmtf.runtime.job.warm) -----------------------------------------
    def warm_due(self, command: RankCommand) -> float | None:
        """Seconds into this attempt after which the next one's ranks start early (at the
        chief's first step at the earliest), or None."""
        usable = self.job.kind in (*MODEL_KINDS, "submitit") and command.kill_on_bad_exit == 1
        if not (usable and self.job.in_slurm and self.job.in_place and self.job.het_size <= 1):
            return None
        return warm_delay(self.job.warm, failed=self.failed or self.attempt > 0)

    def start_standby(self, command: RankCommand, placement: Placement | None = None) -> None:
        """The next attempt's warm step, on ``placement`` (this attempt's by default)."""
        self.stop_standby(at_once=placement is not None)  # a step that may span a lost node
        attempt = self.attempt + 1
        chosen = placement or self.place
        go = go_path(self.job.log_dir, self.job.job_id, attempt, moved=placement is not None)
        env = standby_env(self.step_env(command, attempt), go, self.beats.path, os.getpid())
        err = None if self.job.kind == "submitit" else self.job.srun_err
        args = self.step_args(command, chosen)
        name = moved_step_name(attempt) if placement is not None else ""
        self.standby = Standby.start(
            attempt, chosen.flags, args=args, env=env, go=go, stderr=err, name=name
        )

    def warm_elsewhere(self, command: RankCommand, quiet: tuple[str, ...]) -> None:
        """The beacon finds ``quiet`` nodes of this step silent before the ranks report
        them lost (TensorFlow's heartbeat comes later): the next attempt's warm ranks
        start on the placement a restart without them would take, so that a spare (or
        the nodes left of a range) trains again without importing TensorFlow anew."""
        nodes = dataclasses.replace(self.nodes, excluded=self.place.excluded)
        lost = [n for n in quiet if n in nodes.step_nodes()]
        guess = restart_without(nodes, lost) if lost else None
        if guess is None:
            return
        placement = next_placement(self.job, self.place, guess)
        if placement.flags == self.place.flags:
            return
        if self.standby is not None and self.standby.fits(self.attempt + 1, placement.flags):
            return
        plain(f"{','.join(lost)} silent to the nodes' beacon: warm ranks start on "
              f"{','.join(guess.nodes)} in case the step loses it")  # fmt: skip
        self.start_standby(command, placement)

    def warm_child(self, env: Mapping[str, str]) -> Child | None:
        """The warm step, told to go, when it was made for this attempt and placement."""
        standby, self.standby = self.standby, None
        if standby is None:
            return None
        if not standby.fits(self.attempt, self.place.flags):
            standby.stop(at_once=True)  # the next attempt runs elsewhere: it starts now
            return None
        plain(f"warm ranks take over (started {standby.age():.0f} s before, "
              "SLURMTF_WARM_STANDBY)")  # fmt: skip
        return standby.take_over(env)

    def stop_standby(self, *, at_once: bool = False) -> None:
        if self.standby is not None:
            standby, self.standby = self.standby, None
            standby.stop(at_once=at_once)

    def _node_files(self) -> list[Path]:
        """The files of the nodes' supervised events (slurmtf.events): one per node."""
        out = (n for n in every_node(self.job) if n not in self.place.excluded)
        return [node_events_path(self.job.node_events, node) for node in out]

    def _log_paths(self) -> list[Path]:
        return [*self.job.log_dir.glob(f"{glob_escape(self.job.logs.prefix)}*"), self.job.srun_err]

    # --- before training ------------------------------------------------------------
    def check_first(self) -> int | None:
        """CHECK_FIRST=1: ``slurmtf check`` over the job's nodes first (docs/CHECK.md); an
        outlier node is left out in place while enough remain, else the job is requeued
        without it; either costs a restart; with the budget spent the job stops (exit 1)."""
        if not self.job.check_first:
            return None
        self.files = LogFiles(
            self.job.log_dir, self.job.logs.prefix, self.job.logs.suffix, self.job.srun_err
        )
        bad = CheckFirst(self.job, self.env).outliers(self.attempt)
        if not bad:
            return None
        log(f"check_first: outlier node(s) {','.join(bad)}", error=True)
        decision, line = self.decide(StepEnd(0), bad)
        if decision.action == "restart":
            return self.follow(decision, line, StepEnd(0))
        if decision.action == "requeue":
            log(line)
            if self.requeue(decision, ()):
                return 0
        log(line or "not training on an outlier node", error=True)
        return 1

    # --- signals --------------------------------------------------------------------
    def _install_signals(self) -> None:
        for signum in FORWARDED:
            signal.signal(signum, self._forward)
        signal.signal(signal.SIGTERM, self._terminate)

    def _forward(self, signum: int, _frame: FrameType | None) -> None:
        if self.child is not None:
            self.child.signal(signum)

    def _terminate(self, _signum: int, _frame: FrameType | None) -> None:
        self.terminated = True
        self.beats.now()  # the watcher stands down: the job ends


def job_header(job: JobSettings, attempt: int) -> str:
    """The job log's first line about the job: its attempt, nodes, tasks and folders."""
    per_node = step_tasks(job, job.num_nodes)[1] or job.ntasks_per_node or "?"
    of = f"of {job.budget}"
    if job.budget_mode != "total":
        of = f"(MAX_RESTARTS={job.budget} failures in a row without progress)"
    return (
        f"job {job.job_id} restart {attempt} {of}: {job.num_nodes} node(s) "
        f"{job.nodelist} x {per_node} task(s), model_dir {job.model_dir}, "
        f"per-rank logs {job.log_dir}"
    )


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
        slurm_calls.set_comment(job.job_id, f"{records.COMMENT_PREFIX}{job.log_dir}", runner)
