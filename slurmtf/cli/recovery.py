"""``slurmtf recovery start|decide``: the job scripts' decisions (slurmtf/job.sh calls it).

``start`` prints ``slurmtf_attempt=N``: this attempt's number (restarts in place +
requeues so far, from the job's record and Slurm's requeue count). ``decide`` reads the
attempt that just ended (srun's status and messages, the ranks' event lines from the
offsets the script noted), records a restart, requeue or stop, and prints the decision
as shell assignments (``slurmtf_action``, ``slurmtf_line``, ``slurmtf_exclude``, ...):
:mod:`slurmtf.runtime.attempts`, :mod:`slurmtf.runtime.recovery`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from slurmtf.cli import ArgumentParser, add_flag, run_command
from slurmtf.cluster.hostlists import expand_hostlist
from slurmtf.errors import InputError
from slurmtf.runtime.attempts import LogFiles, Step, decide_step, read_record, restarts_so_far
from slurmtf.runtime.recovery import Nodes

PROGRAM = "slurmtf recovery"


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROGRAM, description=__doc__)
    parser.add_argument("command", choices=("start", "decide"))
    add_flag(parser, "log_dir", type=Path, help="the job's log folder")
    add_flag(parser, "job_id", default="", help="the Slurm job id (names the record)")
    add_flag(parser, "requeues", type=int, default=0, help="Slurm's SLURM_RESTART_COUNT")
    add_flag(parser, "status", type=int, default=0, help="srun's exit status")
    add_flag(parser, "max_restarts", type=int, default=3, help="the restart budget")
    add_flag(parser, "prefix", default="rank", help="rank R's logs: PREFIX R SUFFIX.out|err")
    add_flag(parser, "suffix", default="", help="see --prefix")
    add_flag(parser, "srun_err", type=Path, help="the file srun's stderr is appended to")
    parser.add_argument("--offset", action="append", default=[], metavar="FILE=BYTES")
    add_flag(parser, "nodes", default="", help="the allocation's nodes (a hostlist)")
    add_flag(parser, "excluded", default="", help="nodes left out already (comma-separated)")
    add_flag(parser, "minimum", type=int, help="fewest nodes to train on [all of --nodes]")
    add_flag(parser, "outliers", default="", help="--check_first's outlier nodes (comma-separated)")
    add_flag(parser, "python", default="python3", help="the job's interpreter (for hints)")
    add_flag(parser, "probe_timeout", type=float, default=15.0, help="seconds per node probe")
    return parser


def _offsets(items: Sequence[str]) -> dict[str, int]:
    out = {}
    for item in items:
        path, _, size = item.rpartition("=")
        if not path or not size.isdigit():
            raise InputError("--offset", item, "is not FILE=BYTES", "e.g. --offset=rank0.out=120")
        out[path] = int(size)
    return out


def _body(args: argparse.Namespace) -> int:
    if args.log_dir is None or not args.job_id:
        what = "--log_dir" if args.log_dir is None else "--job_id"
        raise InputError(what, "", "is required", f"{what}=... (slurmtf/job.sh passes it)")
    if args.command == "start":
        used = restarts_so_far(read_record(args.log_dir, args.job_id), args.requeues)
        print(f"slurmtf_attempt={used}")
        return 0
    allocated = tuple(expand_hostlist(args.nodes, name="--nodes")) if args.nodes else ()
    minimum = len(allocated) if args.minimum is None else args.minimum
    excluded = tuple(n for n in args.excluded.split(",") if n)
    files = LogFiles(args.log_dir, args.prefix, args.suffix, args.srun_err, _offsets(args.offset))
    step = Step(
        args.job_id, args.status, args.max_restarts, args.requeues,
        Nodes(allocated, excluded, minimum), args.probe_timeout,
        tuple(n for n in args.outliers.split(",") if n), args.python,
    )  # fmt: skip
    sys.stdout.write(decide_step(step, files))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(PROGRAM, _parser(), argv, _body)
