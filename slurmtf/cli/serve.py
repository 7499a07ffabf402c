"""``slurmtf serve`` / ``python -m slurmtf.serve``: the tasks of a ParameterServerStrategy job.

Run the same line on every task of the step, with roles from ``SLURMTF_JOBS``::

    srun --kill-on-bad-exit=1 python -m slurmtf.serve -- python train.py

(``jobs/parameter_server.sbatch`` runs it with ``--kill-on-bad-exit=0``, so that a
killed worker does not stop the step; the supervisor's parameter-server step.)

The ps and worker tasks start a TensorFlow server and end when the chief's script ends
(:mod:`slurmtf.serve`); the chief (or an evaluator) runs the command after ``--`` in
place of this process, with ``TF_CONFIG`` exported. Bad input exits 2 with one line.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from slurmtf.cli import ArgumentParser, add_flag, run_command
from slurmtf.cluster.env import read_slurm_env
from slurmtf.cluster.layout import ClusterLayout, build_layout
from slurmtf.contracts import EXIT_FAILURE, ignore_warning_signals
from slurmtf.errors import InputError
from slurmtf.events import emit
from slurmtf.monitor.tracker_runs import export_tracker_env
from slurmtf.resolver import export_tf_config
from slurmtf.runtime.rank.chief_watch import POLL_S, START_TIMEOUT_S, ChiefNeverStarted
from slurmtf.runtime.rank.servers import (
    SERVER_ROLES,
    check_server_task,
    chief_of,
    start_server,
    watch_chief,
)

PROGRAM = "slurmtf serve"


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog=PROGRAM,
        description=(
            "On a ps or worker task of a ParameterServerStrategy job, run a TensorFlow "
            "server until the chief's script ends; on the chief, run the command after --."
        ),
    )
    add_flag(
        parser,
        "jobs",
        metavar="ROLES",
        help="roles of the ranks, e.g. 'chief:1,ps:2,worker' (default: SLURMTF_JOBS)",
    )
    add_flag(
        parser,
        "start_timeout",
        type=float,
        default=START_TIMEOUT_S,
        metavar="S",
        help="how long a server waits for the chief's server to come up (default: %(default)s)",
    )
    add_flag(
        parser,
        "poll",
        type=float,
        default=POLL_S,
        metavar="S",
        help="seconds between two looks at the chief (default: %(default)s)",
    )
    add_flag(
        parser,
        "done_file",
        metavar="PATH",
        help="end the servers also when this file exists (e.g. written by the chief)",
    )
    parser.add_argument(
        "chief_command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND",
        help="after --: what the chief (or an evaluator) runs, e.g. -- python train.py",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; a server task's process ends in :func:`_serve`."""
    return run_command(PROGRAM, _parser(), argv, _run)


def _run(args: argparse.Namespace) -> int:
    command = list(args.chief_command)
    if command[:1] == ["--"]:
        command = command[1:]
    for name in ("start_timeout", "poll"):
        if not getattr(args, name) > 0:
            raise InputError(f"--{name}", getattr(args, name), "is not positive", "give seconds")
    layout = build_layout(read_slurm_env(os.environ), jobs=args.jobs, jobs_name="--jobs")
    if layout.roles is not None and layout.task_type not in SERVER_ROLES and command:
        export_tf_config(layout)
        # the job's one tracker run, on the chief (an evaluator logs nowhere that counts)
        export_tracker_env(os.environ, chief=layout.is_chief, rank=layout.task_index)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            raise InputError(
                "command", command[0], f"cannot be run ({exc.strerror})", "give a program on PATH"
            ) from exc
    check_server_task(layout)
    _serve(layout, args)
    return 0  # not reached: _serve ends the process


def _serve(layout: ClusterLayout, args: argparse.Namespace) -> None:
    chief = chief_of(layout)
    # The chief saves on the warning signal and ends, and this server stops with it.
    ignore_warning_signals()
    start_server(layout)
    signal.signal(signal.SIGTERM, lambda *_: _exit(f"{layout.task_type} got SIGTERM", 143))
    emit("serving", rank=layout.task_index, role=layout.task_type, task_id=layout.task_id)
    print(
        f"{PROGRAM}: {layout.task_type} {layout.task_id} serving at "
        f"{layout.workers[layout.task_index]}; it stops when the chief at {chief} ends",
        file=sys.stderr,
        flush=True,
    )
    done_file = None if args.done_file is None else Path(args.done_file)
    try:
        why = watch_chief(
            chief, start_timeout=args.start_timeout, poll=args.poll, done_file=done_file
        )
    except ChiefNeverStarted as exc:
        hint = "run the training script on the chief task (slurmtf serve -- python SCRIPT does it)"
        _exit(f"{exc}. HINT: {hint}, or raise --start_timeout", EXIT_FAILURE)
    _exit(f"stopping: {why}", 0)


def _exit(message: str, status: int) -> None:
    """End the process now: TensorFlow's server has no stop, and its threads would keep
    an ordinary exit waiting."""
    print(f"{PROGRAM}: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(status)
