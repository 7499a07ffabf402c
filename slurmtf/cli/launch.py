"""``python -m slurmtf.launch``: what each task of a job runs (not a user command).

``--spec=FILE [--params=JSON]`` runs the task of a ``--cluster=local`` job
(:func:`slurmtf.runtime.rank.launcher.run_task`); ``--call MODULE:FUNCTION [-- ARGS...]`` calls
``FUNCTION(ARGS)`` (``submit --function``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from slurmtf.cli import ArgumentParser, report_error
from slurmtf.contracts import EXIT_USAGE
from slurmtf.errors import InputError, SlurmtfError, UsageError
from slurmtf.runtime.rank.launcher import call_function, run_warm_task
from slurmtf.spec.jobspec import JobSpec

PROGRAM = "slurmtf.launch"


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=f"python -m {PROGRAM}", description=__doc__)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--spec", type=Path, metavar="FILE", help="the job's JobSpec as JSON")
    what.add_argument("--call", metavar="MODULE:FUNCTION", help="call FUNCTION(argv)")
    parser.add_argument("--params", default="{}", metavar="JSON", help="this grid point")
    parser.add_argument("args", nargs="*", help="after --: the function's arguments")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status of the task (2: bad arguments, 1: a slurmtf error)."""
    try:
        args = _parser().parse_args(argv)
    except UsageError as exc:
        return report_error(PROGRAM, exc)
    if args.call is not None:
        return call_function(args.call, args.args)
    if args.args:
        print(f"{PROGRAM}: unexpected arguments {args.args}", file=sys.stderr)
        return EXIT_USAGE
    try:
        try:
            params = json.loads(args.params)
        except ValueError as exc:
            raise InputError("--params", args.params, "is not JSON", 'e.g. {"lr": "0.1"}') from exc
        spec = JobSpec.from_json(json.loads(args.spec.read_text()))
        return run_warm_task(spec, params, os.environ)
    except SlurmtfError as exc:
        return report_error(PROGRAM, exc)
