"""``slurmtf recovery start|watch|decide``: the supervisor's decisions as shell assignments,
for inspection and batch scripts of one's own (the job scripts' supervisor calls
:mod:`slurmtf.runtime.attempts` itself).

``start`` prints ``slurmtf_attempt=N``: this attempt's number (restarts in place +
requeues so far, from the job's record and Slurm's requeue count), and the first step's
nodes (``slurmtf_nodes``: the first N of N+``--spare_nodes``), after checking
``SPARE_NODES`` and ``MIN_NODES``. ``watch`` runs while a step does: it probes the nodes
the ranks say they lost and prints the silent ones (``slurmtf_lost``), for which the
script ends the step at once. ``decide`` reads the
attempt that just ended (srun's status and messages, the ranks' event lines from the
offsets the script noted), records a restart, requeue or stop, and prints the decision
as shell assignments (``slurmtf_action``, ``slurmtf_line``, ``slurmtf_exclude``, ...):
:mod:`slurmtf.runtime.attempts`, :mod:`slurmtf.runtime.recovery`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

from slurmtf.cli import ArgumentParser, add_flag, run_command
from slurmtf.cluster.hostlists import expand_hostlist
from slurmtf.errors import InputError
from slurmtf.runtime.attempts import (
    LogFiles,
    Step,
    decide_step,
    read_record,
    restart_in_place,
    restarts_so_far,
    shell_assignments,
    watch_step,
)
from slurmtf.runtime.jobslurm import range_minimum
from slurmtf.runtime.node_choice import job_nodes
from slurmtf.slurm.runner import default_runner

PROGRAM = "slurmtf recovery"


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROGRAM, description=__doc__)
    parser.add_argument("command", choices=("start", "watch", "decide"))
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
    add_flag(parser, "minimum", default="", help="MIN_NODES: fewest nodes to train on [N]")
    add_flag(parser, "spare_nodes", default="", help="SPARE_NODES: train on N of N+K nodes [0]")
    add_flag(parser, "dead", default="", help="nodes the watch found silent (comma-separated)")
    add_flag(parser, "probed", default="", help="nodes that answered a probe this step")
    add_flag(parser, "in_place", default="1", help="SLURMTF_RESTART_IN_PLACE: 0 requeues instead")
    add_flag(parser, "outliers", default="", help="--check_first's outlier nodes (comma-separated)")
    add_flag(parser, "python", default="python3", help="the job's interpreter (for hints)")
    add_flag(parser, "probe_timeout", type=float, default=10.0, help="seconds per node probe")
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
        raise InputError(what, "", "is required", f"{what}=...")
    allocated = tuple(expand_hostlist(args.nodes, name="--nodes")) if args.nodes else ()
    minimum = args.minimum
    if not minimum and not args.spare_nodes and args.command != "watch":
        minimum = range_minimum(args.job_id, len(allocated), default_runner)
    nodes = job_nodes(allocated, args.spare_nodes, minimum)
    nodes = dataclasses.replace(nodes, excluded=_names(args.excluded))
    if args.command == "start":
        used = restarts_so_far(read_record(args.log_dir, args.job_id), args.requeues)
        first = ",".join(nodes.first_step()) if nodes.width else ""
        sys.stdout.write(shell_assignments(attempt=str(used), nodes=first))
        return 0
    files = LogFiles(args.log_dir, args.prefix, args.suffix, args.srun_err, _offsets(args.offset))
    if args.command == "watch":
        lost, alive = watch_step(files, nodes, _names(args.probed), default_runner,
                                 args.probe_timeout)  # fmt: skip
        sys.stdout.write(shell_assignments(lost=",".join(lost), probed=",".join(alive)))
        return 0
    step = Step(
        args.job_id, args.status, args.max_restarts, args.requeues, nodes, args.probe_timeout,
        _names(args.outliers), args.python, dead=_names(args.dead), alive=_names(args.probed),
        in_place=restart_in_place(args.in_place),
    )  # fmt: skip
    sys.stdout.write(decide_step(step, files))
    return 0


def _names(text: str) -> tuple[str, ...]:
    return tuple(n for n in text.split(",") if n)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(PROGRAM, _parser(), argv, _body)
