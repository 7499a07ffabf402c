"""``slurmtf resolve`` / ``python -m slurmtf.resolver``: print this task's TF_CONFIG.

``--explain`` prints the layout as a table, ``--export`` prints shell ``export`` lines
for ``eval "$(python -m slurmtf.resolver --export)"`` and ``--flags`` the two flags
TensorFlow's official models take (``--worker_hosts=... --task_index=N``). Bad input
exits with status 2 and one line on stderr. Never imports TensorFlow.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Sequence

from slurmtf.cli import ArgumentParser, add_flag, run_command
from slurmtf.cluster.env import read_slurm_env
from slurmtf.cluster.flags import cluster_flags
from slurmtf.cluster.layout import build_layout
from slurmtf.resolver import explain, export_lines

PROGRAM = "slurmtf resolve"


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog=PROGRAM,
        description=(
            "Print TF_CONFIG for this Slurm task (run it under srun). Outside Slurm, or in "
            "a one-task step, the cluster is a single local worker."
        ),
    )
    view = parser.add_mutually_exclusive_group()
    view.add_argument("--explain", action="store_true", help="print the layout as a table instead")
    view.add_argument(
        "--export",
        action="store_true",
        help='print shell export lines, for eval "$(python -m slurmtf.resolver --export)". '
        "They set TF_CONFIG and SLURMTF_* only: they cannot apply slurmtf's Keras 3 "
        "model.fit and flat-memory fixes to the Python that runs next; start scripts "
        "with `python -m slurmtf.run SCRIPT` for those",
    )
    view.add_argument(
        "--flags",
        action="store_true",
        help="print this task's place as TensorFlow's official models take it: "
        "--worker_hosts=H1:P1,H2:P2,... --task_index=N (workers only: not in a ps job)",
    )
    add_flag(
        parser,
        "port_base",
        metavar="PORT",
        help="port of rank 0; rank r uses PORT+r, on every attempt (default: SLURMTF_PORT_BASE, "
        "else the step's SLURM_STEP_RESV_PORTS, else from the job id, moved by the attempt)",
    )
    add_flag(
        parser,
        "address_template",
        metavar="TEMPLATE",
        help="address of each node, e.g. '{host}-ib' (default: the node name, or "
        "SLURMTF_ADDRESS_TEMPLATE)",
    )
    add_flag(
        parser,
        "jobs",
        metavar="ROLES",
        help="roles of the ranks in order, e.g. 'chief:1,ps:2,worker' (the last takes the "
        "rest) or 'ps@0,worker@1' by het component (default: SLURMTF_JOBS, else all workers)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log which variables are used")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: exit 0 with the output, or 2 with one line on stderr."""
    return run_command(PROGRAM, _parser(), argv, _run_logged)


def _run_logged(args: argparse.Namespace) -> int:
    """:func:`_run`, with the package's log on stderr for ``--verbose``."""
    handler = None
    package_log = logging.getLogger("slurmtf")
    if args.verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        package_log.addHandler(handler)
        package_log.setLevel(logging.DEBUG)
    try:
        return _run(args)
    finally:
        if handler is not None:
            package_log.removeHandler(handler)
            package_log.setLevel(logging.NOTSET)


def _run(args: argparse.Namespace) -> int:
    layout = build_layout(
        read_slurm_env(os.environ),
        port_base=args.port_base,
        address_template=args.address_template,
        jobs=args.jobs,
        port_base_name="--port_base",
        address_template_name="--address_template",
        jobs_name="--jobs",
    )
    if args.explain:
        print(explain(layout))
    elif args.export:
        print(export_lines(layout))
    elif args.flags:
        print(shlex.join(cluster_flags(layout)))
    else:
        print(layout.tf_config_json())
    return 0
