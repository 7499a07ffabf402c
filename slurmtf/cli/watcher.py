"""``slurmtf watcher``: the job's watcher, which the supervisor starts as a one-task
``srun --overlap`` step on a node other than the batch host; it requeues the job when
the batch host is lost (:mod:`slurmtf.runtime.batch_host.watcher`). Not for users to run: the
supervisor passes every option."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from slurmtf.cli import ArgumentParser, add_flag, run_command
from slurmtf.contracts import ignore_warning_signals
from slurmtf.errors import InputError
from slurmtf.runtime.batch_host.watcher import Watcher, WatchSettings
from slurmtf.runtime.recovery.budget import DEFAULT_MODE, parse_mode
from slurmtf.slurm.runner import default_runner

PROGRAM = "slurmtf watcher"


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROGRAM, description=__doc__)
    add_flag(parser, "job_id", default="", help="the Slurm job id")
    add_flag(parser, "log_dir", type=Path, help="the job's log folder")
    add_flag(parser, "host", default="", help="the batch host")
    add_flag(parser, "heartbeat_s", type=float, default=5.0, help="the supervisor's beat")
    add_flag(parser, "max_restarts", type=int, default=3, help="the restart budget")
    add_flag(parser, "restart_budget", default=DEFAULT_MODE, help="what --max_restarts counts")
    add_flag(parser, "max_failures_per_hour", type=int, default=0, help="0: no limit")
    add_flag(parser, "requeues", type=int, default=0, help="SLURM_RESTART_COUNT at the start")
    add_flag(parser, "probe_s", type=float, default=10.0, help="seconds per probe of the host")
    add_flag(parser, "job_log", type=Path, help="the job's log, for the watcher's lines")
    add_flag(parser, "host_group", type=int, help="the batch host's het component (0)")
    return parser


def _body(args: argparse.Namespace) -> int:
    for name in ("job_id", "log_dir", "host"):
        if not getattr(args, name):
            raise InputError(
                f"--{name}", "", "is required", f"--{name}=... (the supervisor passes it)"
            )
    settings = WatchSettings(
        args.job_id, args.log_dir, args.host, args.heartbeat_s, args.max_restarts,
        args.requeues, args.probe_s, args.job_log, args.host_group,
        parse_mode(args.restart_budget, "--restart_budget"), args.max_failures_per_hour,
    )  # fmt: skip
    ignore_warning_signals()  # a step of the job: it watches to the job's end
    return Watcher(settings, default_runner).run()


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(PROGRAM, _parser(), argv, _body)
