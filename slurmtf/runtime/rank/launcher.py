"""What each task of a submitted job runs: resolve, export TF_CONFIG, run, report the end.

Under Slurm, submitit's ``srun`` starts one Python per task, which unpickles a
:class:`TaskLauncher` and calls it. The launcher resolves this task's place in the
cluster with :func:`slurmtf.resolver.resolve`, writes ``TF_CONFIG`` into the child's
environment explicitly, runs the model (or the user's module, function or command) as a
child process whose output goes to this rank's log, and maps its exit status:

* 0: done.
* 75 (preempted after saving a checkpoint): every task returns 0, so that
  ``srun --kill-on-bad-exit`` interrupts nobody, and the job's supervisor
  (``slurmtf job submitit``, to which the setup lines of a job with ``--max_restarts`` > 0
  hand the step; it exports :data:`SUPERVISED_ENV`) requeues the job within the one
  restart budget that its other failures count against. The launcher never requeues by
  itself: without the supervisor the task exits 75 and the job ends there.
* anything else: this task exits with it (128+N for a child ended by signal N, which
  the supervisor classifies as that signal, as when srun reports the signal itself),
  and ``--kill-on-bad-exit`` stops the others.

Slurm delivers the preemption signal to every process of the step, the child included;
the launcher only notes it (submitit's own handler would requeue at once, before the
model has written its checkpoint). SIGTERM it passes on and waits out, so that a rank
whose peer failed saves from memory before the task ends (slurmtf.training.rescue).

``python -m slurmtf.launch --spec=FILE [--params=JSON]`` runs the same code for
``--cluster=local``; ``python -m slurmtf.launch --call MOD:FN -- ARGS`` calls a user's
``FN(argv) -> int``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from slurmtf.cluster.env import read_slurm_env
from slurmtf.cluster.layout import ClusterLayout
from slurmtf.contracts import (
    EXIT_PREEMPTED,
    ending_signal,
    parse_preemption_signal,
    shell_status,
)
from slurmtf.events import emit
from slurmtf.monitor.tracking import export_rank_env
from slurmtf.resolver import export_tf_config, resolve
from slurmtf.runtime.rank import standby
from slurmtf.runtime.rank.held_port import check_port
from slurmtf.spec.jobspec import LEGACY_KERAS_ENV, JobSpec, chief_done_file, task_command

LOCAL_ENV = "SLURMTF_LOCAL"  # set by --cluster=local: exit 75 is rerun there, not requeued
# Set by the supervisor for the ranks of a job it runs: it decides after exit 75.
SUPERVISED_ENV = "SLURMTF_SUPERVISED"
# Its former name, still read: a job submitted before the rename may set only this one.
OLD_SUPERVISED_ENV = "SLURMTF_JOB_SH"


def supervised(environ: Mapping[str, str]) -> bool:
    """Whether the job's supervisor decides after exit 75 (``SLURMTF_SUPERVISED=1``, or
    ``SLURMTF_JOB_SH=1`` where a job submitted before the rename set the old name)."""
    value = environ.get(SUPERVISED_ENV)
    return (value if value is not None else environ.get(OLD_SUPERVISED_ENV)) == "1"


def job_id_of(environ: Mapping[str, str]) -> str:
    """The id that names this job's files (:attr:`slurmtf.cluster.env.SlurmEnv.job_label`)."""
    return read_slurm_env(environ).job_label


def child_environment(
    environ: Mapping[str, str], layout: ClusterLayout, *, legacy_keras: bool = False
) -> dict[str, str]:
    """The child's environment: ours plus TF_CONFIG for this task (explicit export), its
    tracker variables (:mod:`slurmtf.monitor.tracking`), and ``TF_USE_LEGACY_KERAS=1`` for
    ``--legacy_keras``."""
    env = dict(environ)
    export_tf_config(layout, env)
    export_rank_env(env, chief=layout.is_chief, rank=layout.task_index)
    if legacy_keras:
        env[LEGACY_KERAS_ENV] = "1"
    return env


def run_task(
    spec: JobSpec,
    params: Mapping[str, str],
    environ: Mapping[str, str],
    python: str = sys.executable,
) -> int:
    """Run this task's command; returns the exit status this task should end with."""
    layout = resolve(environ)  # SLURM_PROCID and SLURM_RESTART_COUNT checked there
    if standby.go_file(environ) is None:  # a warm model's child checks once told to go
        check_port(layout)  # a held port ends this attempt (port_in_use), not the job
    rank = layout.task_index
    job = job_id_of(environ)
    restart = layout.restart_count
    command = task_command(spec, params, python=python, job_id=job, restart=restart)
    env = child_environment(environ, layout, legacy_keras=spec.legacy_keras)
    # Where a script keeps its checkpoints and summaries, and the job's log folder, as the
    # job scripts export them: the model folder `slurmtf tensorboard JOB` looks in (the
    # models' --model_dir default), the log folder that holds the job's recovery record.
    env.setdefault("MODEL_DIR", str(Path(spec.folder) / f"{job}_model"))
    env.setdefault("LOG_DIR", str(spec.folder))

    def launched(child: subprocess.Popen[bytes]) -> None:
        """The ``launch`` event; a warm model's once its child is told to go."""
        if standby.wait_for_go(environ, alive=lambda: child.poll() is None) is None:
            return  # not needed, or ended by itself: no attempt was launched
        emit(
            "launch",
            rank=rank,
            job_id=job,
            node=environ.get("SLURMD_NODENAME", ""),
            restart_count=layout.restart_count,
            params=dict(params),
            command=command,
            tf_config=layout.tf_config(),  # as exported into the child's TF_CONFIG
        )

    signum = parse_preemption_signal(spec.signal, "--signal")

    def note(sig: int, frame: FrameType | None) -> None:
        del frame
        emit("signal", rank=rank, signal=signal.Signals(sig).name)

    status = _run_child(command, env, signum, note, launched)
    if spec.jobs is not None and layout.task_type == "chief":
        _touch(chief_done_file(spec, job, restart))  # the servers stop, however it ended
    ended_by = ending_signal(status)
    emit("exit", rank=rank, status=status, **({"signal": ended_by.name} if ended_by else {}))
    if status != EXIT_PREEMPTED:
        # A child ended by signal N: 128+N, which the supervisor reads as that signal.
        return shell_status(status)
    if supervised(environ) and environ.get(LOCAL_ENV) != "1":
        return 0  # the supervisor decides; srun must stop no one
    return EXIT_PREEMPTED


def _run_child(
    command: Sequence[str],
    env: Mapping[str, str],
    signum: int,
    note: Any,
    started: Callable[[subprocess.Popen[bytes]], None],
) -> int:
    """Run ``command`` to its end; its exit status. The preemption signal is only noted,
    and SIGTERM is passed on and waited out: a step's end (srun after a failed task,
    ``scancel``) lets the child finish its step and save from memory first, and the
    task ends with the child (Slurm's SIGKILL after KillWait bounds the wait).
    ``started`` is called with the child once the signals are set."""
    child = subprocess.Popen(command, env=env)

    def pass_on(sig: int, frame: FrameType | None) -> None:
        del frame
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(sig)

    previous = signal.signal(signum, note)
    previous_term = signal.signal(signal.SIGTERM, pass_on) if signum != signal.SIGTERM else None
    try:
        started(child)
        return child.wait()
    finally:
        signal.signal(signum, previous)
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)


def _touch(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError as exc:  # the servers still stop when the chief's port closes
        print(f"slurmtf: cannot write {path}: {exc.strerror}", file=sys.stderr)


class TaskLauncher:
    """The callable submitit pickles: plain data in, ``run_task`` at call time."""

    def __init__(self, spec: JobSpec, params: Mapping[str, str]) -> None:
        self.spec_json = spec.to_json()
        self.params = dict(params)

    def __call__(self) -> int:
        spec = JobSpec.from_json(self.spec_json)
        status = run_warm_task(spec, self.params, os.environ)
        if status:
            # Not an exception: the task's exit status is the model's, for --kill-on-bad-exit
            # and for the job's state.
            raise SystemExit(status)
        return 0


def run_warm_task(
    spec: JobSpec, params: Mapping[str, str], environ: MutableMapping[str, str]
) -> int:
    """:func:`run_task`, for a warm task (:mod:`slurmtf.runtime.rank.standby`) once told
    to go: a bundled model's child imports TensorFlow and waits itself; anything else
    waits here. A warm task told to go away ends without a word (:func:`_leave_unseen`)."""
    go = standby.go_file(environ)
    if go is not None:
        if spec.jobs is not None:
            _leave_unseen()  # a parameter-server job's restart starts its servers anew
        if spec.kind != "model" and not standby.start_when_told(environ):
            _leave_unseen()
    status = run_task(spec, params, environ)
    if go is not None and standby.told_to_leave(go):
        _leave_unseen()  # the model's child was told to go away
    return status


def _leave_unseen() -> None:
    """A warm task that was not needed ends here, before submitit writes a result for a
    job it never ran."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def call_function(target: str, argv: Sequence[str]) -> int:
    """Import ``MOD:FN`` and call ``FN(argv)``; ``None`` counts as success."""
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    result = obj(list(argv))
    return 0 if result is None else int(result)
