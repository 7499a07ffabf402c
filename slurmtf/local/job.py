"""``--cluster=local``: the same job as N local processes, through the same resolver path.

Each process runs ``python -m slurmtf.launch`` with the ``SLURM_*`` variables a real
``srun`` step would set, so :func:`slurmtf.resolver.resolve` builds TF_CONFIG exactly as
on a cluster. One node is ``localhost``; with ``--nodes=N`` the nodes are the loopback
addresses ``127.0.0.1..127.0.0.N`` (the resolver gives every rank its own port, so they
can share the machine). Sweeps run one grid point after the other.

A grid point's ranks are one step: when one fails, the others are stopped (as srun
``--kill-on-bad-exit`` stops them) and what follows is decided and recorded as the job
scripts decide it (:mod:`slurmtf.runtime.recovery.decision`, through
:func:`slurmtf.runtime.recovery.after_step.decide_and_record`): a killed rank, a lost peer, a stall
or a preemption restarts every rank in place, resuming from the last checkpoint, with
``SLURM_RESTART_COUNT`` = the attempt, within the one ``--max_restarts`` budget; a rank's
own error or exit 2 stops the job with its line. The record is
``recovery-<job>.jsonl`` in the log folder, the log line the job scripts' (``restart 1 of
3 in place (MAX_RESTARTS), 4.0 s after rank 1 was killed by SIGKILL``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from slurmtf.contracts import EXIT_PREEMPTED, rank_log_paths
from slurmtf.events import parse_events
from slurmtf.local.step import LocalStep, node_names, start_rank
from slurmtf.monitor.status import summary
from slurmtf.monitor.tracker_runs import job_run_env
from slurmtf.monitor.tracking import LAST_STEP_ENV, RUN_ID_ENV
from slurmtf.runtime.job.follow import read_from
from slurmtf.runtime.job.settings import WARM_ENV, warm_mode
from slurmtf.runtime.job.warm import STOP_WAIT_S, go_path, trains, warm_delay, warm_now
from slurmtf.runtime.rank.launcher import LOCAL_ENV, job_id_of
from slurmtf.runtime.rank.standby import OF_ENV, STANDBY_ENV, remove_files, write_go
from slurmtf.runtime.recovery.after_step import Step, decide_and_record
from slurmtf.runtime.recovery.endings import srun_words
from slurmtf.runtime.recovery.evidence import LogFiles
from slurmtf.runtime.recovery.record import read_record, restarts_so_far
from slurmtf.spec.jobspec import JobSpec, rank_python

KILL_WAIT_S = 5.0  # between the SIGTERM and the SIGKILL that end a step (Slurm's KillWait)
SETTLE_S = 0.5  # for the other ranks to end after one that failed without a signal


def job_ids(base: int, index: int, size: int) -> dict[str, str]:
    """Numeric Slurm-like ids: a job, or array task ``index`` of array ``base``."""
    if size == 1:
        return {"SLURM_JOB_ID": str(base)}
    return {
        "SLURM_JOB_ID": str(base + 1 + index),
        "SLURM_ARRAY_JOB_ID": str(base),
        "SLURM_ARRAY_TASK_ID": str(index),
    }


def rank_step(spec: JobSpec, ids: Mapping[str, str], restarts: int) -> LocalStep:
    """The ``srun`` step of one grid point: ``spec.nodes`` loopback nodes, block order."""
    names = node_names(spec.nodes)
    extra = {**ids, "SLURM_JOB_NAME": spec.job_name, LOCAL_ENV: "1"}  # SLURMTF_LOCAL; + array ids
    return LocalStep(
        names, spec.tasks_per_node, ids["SLURM_JOB_ID"], restarts=restarts, extra=extra
    )


def local_files(spec: JobSpec, job_id: str) -> LogFiles:
    """Where a local job's attempt is read from: its ranks' logs in the log folder and the
    file this runner writes srun's ``task N: ...`` words to (``<job>_srun.err``)."""
    return LogFiles(spec.folder, f"{job_id}_", "_log", spec.folder / f"{job_id}_srun.err")


def at_the_end(files: LogFiles, num_tasks: int) -> LogFiles:
    """``files`` with this attempt starting where each log ends now (they are appended to)."""
    paths = [files.rank_file(r, k) for r in range(num_tasks) for k in ("out", "err")]
    if files.srun_err is not None:
        paths.append(files.srun_err)
    offsets = {str(p): p.stat().st_size for p in paths if p.exists()}
    return dataclasses.replace(files, offsets=offsets)


def stop_ranks(procs: Sequence[subprocess.Popen[bytes]], grace: float = KILL_WAIT_S) -> None:
    """End every rank's process group (the launcher and the user's process under it) as
    srun --kill-on-bad-exit ends a step: SIGTERM, then SIGKILL to the groups still there
    after ``grace`` seconds (Slurm's KillWait); reap the launchers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
        deadline = time.monotonic() + grace
        while sig == signal.SIGTERM and time.monotonic() < deadline:
            if all(_group_gone(p) for p in procs):
                break
            time.sleep(0.1)
    for proc in procs:
        proc.wait()


def _group_gone(proc: subprocess.Popen[bytes]) -> bool:
    proc.poll()
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def wait_ranks(
    procs: Sequence[subprocess.Popen[bytes]],
    srun_err: Path,
    each_look: Callable[[], None] = lambda: None,
    ended_at: Callable[[int], float | None] = lambda rank: None,
) -> int:
    """Wait for every rank; when one fails, write srun's words for it (and any other that
    failed by itself) to ``srun_err`` and stop the rest. The step's status: the first
    failure's (128+N for signal N), else the highest exit code (75 when preempted).
    ``each_look`` runs at every look (every 0.2 s); ``ended_at(rank)`` is when that rank's
    launcher said it ended, which orders the failures seen at one look."""
    codes: list[int | None] = [None] * len(procs)
    while any(c is None for c in codes):
        each_look()
        codes = [c if c is not None else p.poll() for c, p in zip(codes, procs, strict=True)]
        failed = _failures(codes)
        if failed:  # like srun --kill-on-bad-exit, which names the first task that failed
            if not any(_by_signal(c) for _, c in failed):
                codes = _settle(procs, codes)  # the rank it lost may end a moment later
                failed = _failures(codes)
            failed.sort(key=lambda failure: ended_at(failure[0]) or math.inf)
            with srun_err.open("a") as err:
                err.writelines(f"task {r}: {srun_words(c)}\n" for r, c in failed)
            stop_ranks(procs)
            code = failed[0][1]
            return 128 - code if code < 0 else code
        time.sleep(0.2)
    return max(int(c or 0) for c in codes)


def exit_time(log: Path, offset: int) -> float | None:
    """When the launcher writing ``log`` said it ended (its last ``exit`` event after
    ``offset``), if it did."""
    if not log.exists():
        return None
    ends = [e for e in parse_events(read_from(log, offset).decode(errors="replace"))
            if e.get("event") == "exit"]  # fmt: skip
    when = ends[-1].get("time") if ends else None
    return float(when) if isinstance(when, int | float) else None


def _failures(codes: Sequence[int | None]) -> list[tuple[int, int]]:
    return [(r, c) for r, c in enumerate(codes) if c is not None and c not in (0, EXIT_PREEMPTED)]


def _by_signal(code: int) -> bool:
    """A launcher ended by a signal, or one whose child was (128+N)."""
    return code < 0 or code > 128


def _settle(procs: Sequence[subprocess.Popen[bytes]], codes: list[int | None]) -> list[int | None]:
    """The codes once the ranks still running had :data:`SETTLE_S` to end: a survivor that
    lost its peer may be seen before the peer's own ending, which srun would name first."""
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline and any(c is None for c in codes):
        time.sleep(0.05)
        codes = [c if c is not None else p.poll() for c, p in zip(codes, procs, strict=True)]
    return codes


@dataclasses.dataclass
class Point:
    """One grid point's job: how its ranks start, and its warm ranks (the next attempt's
    processes, started early: :mod:`slurmtf.runtime.job.warm`) when it has some."""

    spec: JobSpec
    params: Mapping[str, str]
    ids: Mapping[str, str]
    spec_file: Path
    warm_mode: str = "auto"  # SLURMTF_WARM_STANDBY
    warm: WarmRanks | None = None
    out: TextIO = sys.stdout  # where the runner's lines go

    def start(
        self, environ: Mapping[str, str], restarts: int, go: Path | None = None
    ) -> list[subprocess.Popen[bytes]]:
        """Every rank of attempt ``restarts`` (each in its own process group); warm
        ones, waiting for ``go``, when it is given."""
        files = local_files(self.spec, job_id_of(self.ids))
        prefix = shlex.split(self.spec.container_prefix)  # --container_prefix, as on a cluster
        python = rank_python(self.spec, sys.executable)
        command = [*prefix, python, "-u", "-m", "slurmtf.launch", f"--spec={self.spec_file}"]
        command.append(f"--params={json.dumps(dict(self.params))}")
        step = rank_step(self.spec, self.ids, restarts)
        warm = {}
        if go is not None:
            remove_files(go, side_files=False)  # an earlier attempt's word
            warm = {STANDBY_ENV: str(go), OF_ENV: str(os.getpid())}
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for rank in range(self.spec.num_tasks):
                env = {**environ, **step.rank_env(rank), **warm}
                out, err = files.rank_file(rank, "out"), files.rank_file(rank, "err")
                procs.append(start_rank(command, env, out, err, append=True))
        except BaseException:
            stop_ranks(procs)
            raise
        return procs

    def stop_warm(self) -> None:
        if self.warm is not None:
            warm, self.warm = self.warm, None
            warm.stop()


@dataclasses.dataclass
class WarmRanks:
    """The warm ranks of one attempt, waiting for their go file."""

    attempt: int
    procs: list[subprocess.Popen[bytes]]
    go: Path

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        """Tell them to go away; end whoever is left after a moment."""
        with contextlib.suppress(OSError):
            write_go(self.go, False)
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.05)
        stop_ranks(self.procs)
        remove_files(self.go)


def run_point(point: Point, *, environ: Mapping[str, str], restarts: int) -> int:
    """Start every rank of one grid point (or tell its warm ones to go), wait, stop the
    rest when one fails; srun's exit status for the step. The next attempt's warm ranks
    start after the chief's first step (``SLURMTF_WARM_STANDBY``)."""
    job_id = job_id_of(point.ids)
    files = local_files(point.spec, job_id)
    warm, point.warm = point.warm, None
    go = go_path(point.spec.folder, job_id, restarts)
    if warm is not None and warm.attempt == restarts and warm.alive():
        print("slurmtf: warm ranks take over (SLURMTF_WARM_STANDBY)", file=point.out, flush=True)
        tracked = (RUN_ID_ENV, LAST_STEP_ENV)  # asked at each start
        write_go(warm.go, True, {k: environ[k] for k in tracked if k in environ})
        procs = warm.procs
    else:
        if warm is not None:
            warm.stop()
        procs = point.start(environ, restarts)
    logs = [files.rank_file(rank, "out") for rank in range(len(procs))]
    offsets = [log.stat().st_size if log.exists() else 0 for log in logs]
    chief, offset = logs[0], offsets[0]
    delay = warm_delay(point.warm_mode, failed=restarts > 0)
    started = time.monotonic()

    def keep_warm() -> None:
        nonlocal delay
        if delay is None or point.warm is not None:
            return
        text = read_from(chief, offset).decode(errors="replace") if chief.exists() else ""
        if warm_now(delay, trains(parse_events(text)), time.monotonic() - started):
            delay = None
            next_go = go_path(point.spec.folder, job_id, restarts + 1)
            ranks = point.start(environ, restarts + 1, next_go)
            point.warm = WarmRanks(restarts + 1, ranks, next_go)

    def ended_at(rank: int) -> float | None:
        return exit_time(logs[rank], offsets[rank])

    try:
        return wait_ranks(procs, files.srun_err or point.spec.folder / f"{job_id}_srun.err",
                          keep_warm, ended_at)  # fmt: skip
    finally:  # Ctrl-C, or a rank that failed to start: no rank outlives the step
        stop_ranks(procs)
        with contextlib.suppress(OSError):
            go.unlink()


def run_attempts(spec: JobSpec, params: Mapping[str, str], ids: Mapping[str, str], *,
                 spec_file: Path, environ: Mapping[str, str], out: TextIO) -> int:  # fmt: skip
    """Run one grid point until it is done or stopped: a killed rank, a lost peer, a stall
    or a preemption restarts every rank in place (from the last checkpoint) within the
    ``--max_restarts`` budget, decided and recorded as the job scripts do
    (:func:`slurmtf.runtime.recovery.after_step.decide_and_record`); the final status."""
    job_id = job_id_of(ids)
    files = local_files(spec, job_id)
    attempt = restarts_so_far(read_record(spec.folder, job_id), 0)
    mode = warm_mode(environ.get(WARM_ENV) or "auto")
    point = Point(spec, params, ids, spec_file, mode, out=out)
    try:
        return _attempts(point, files, attempt, environ, out)
    finally:
        point.stop_warm()


def _attempts(point: Point, files: LogFiles, attempt: int, environ: Mapping[str, str],
              out: TextIO) -> int:  # fmt: skip
    spec, job_id = point.spec, job_id_of(point.ids)
    while True:
        files = at_the_end(files, spec.num_tasks)
        named = {**environ, **point.ids, "SLURM_JOB_NAME": spec.job_name}
        run = job_run_env(named, lambda line: print(f"slurmtf: {line}", file=out, flush=True))
        status = run_point(  # SLURMTF_MLFLOW_RUN_ID, SLURMTF_MLFLOW_LAST_STEP
            point, environ={**environ, **run}, restarts=attempt
        )
        step = Step(job_id, status, spec.max_requeues, on_this_machine=True,
                    mode=spec.restart_budget, per_hour=spec.max_failures_per_hour)  # fmt: skip
        decision, line = decide_and_record(step, files)
        if decision.note:
            print(f"slurmtf: {decision.note}", file=out, flush=True)
        if decision.action != "restart":
            point.stop_warm()
            if decision.action == "stop" or decision.why != "completed":
                print(f"slurmtf: {line}", file=out, flush=True)
            return decision.status
        print(f"slurmtf: {line}", file=out, flush=True)
        attempt = decision.restart


def run_local(spec: JobSpec, out: TextIO, environ: Mapping[str, str] | None = None) -> int:
    """Run every grid point as local processes; print logs and summaries; worst status."""
    env = dict(os.environ if environ is None else environ)
    spec.folder.mkdir(parents=True, exist_ok=True)
    base = os.getpid()
    spec_file = spec.folder / f"{base}_local_spec.json"
    spec_file.write_text(json.dumps(spec.to_json()))
    grid = spec.grid
    worst = 0
    for index, params in enumerate(grid):
        ids = job_ids(base, index, len(grid))
        job_id = job_id_of(ids)
        label = f" {params}" if params else ""
        print(f"slurmtf: local job {job_id}{label}: {spec.num_tasks} process(es); logs:", file=out)
        for rank, path in enumerate(rank_log_paths(spec.folder, job_id, spec.num_tasks)):
            print(f"  rank {rank}: {path}", file=out)
        out.flush()
        status = run_attempts(spec, params, ids, spec_file=spec_file, environ=env, out=out)
        worst = max(worst, status)
        print(summary(job_id, spec.folder, spec.num_tasks, status), file=out, flush=True)
    return worst
