"""``slurmtf sweep JOB``: the results table of a sweep (job array), one row per point.

Each row: the point's parameters, state, restarts, step/total, its final (or, while it
runs, latest, marked ``*``) loss and accuracy, examples/s and the path of its rank 0
log; a failed point's last error line under it. ``slurmtf status JOB`` prints the same
table for a job array. Found from the id alone, like ``slurmtf status``. It also writes
the sweep's HParams data beside its logs (``<job>_hparams``) for ``slurmtf tensorboard``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from slurmtf.cli import ArgumentParser, add_flag, run_command
from slurmtf.errors import InputError
from slurmtf.monitor.hparams import write_rows
from slurmtf.monitor.slurm_view import SlurmView, ask_slurm
from slurmtf.monitor.sweep_rows import METRICS, render_csv, render_json, render_table, sort_rows
from slurmtf.monitor.sweeps import collect
from slurmtf.slurm.runner import Runner, default_runner

PROGRAM = "slurmtf sweep"


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROGRAM, description=__doc__)
    parser.add_argument("job", metavar="JOB", help="the job array's id, e.g. 1234")
    add_flag(parser, "log_dir", metavar="DIR", help="the sweep's log folder (found by default)")
    add_flag(
        parser,
        "sort",
        metavar="COLUMN",
        help=f"best first by a column ({', '.join(METRICS)}) or a parameter",
    )
    parser.set_defaults(hparams=True)
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="one JSON object")
    form.add_argument("--csv", action="store_true", help="CSV with a header line")
    return parser


def print_sweep(
    job_id: str, options: argparse.Namespace, runner: Runner, view: SlurmView | None = None
) -> bool:
    """Print the sweep's table in the form asked for; False when ``job_id`` is no array.
    ``view``: Slurm's answer when already asked; one that did not come is a line on stderr."""
    view = view or ask_slurm(job_id, runner)
    rows = collect(job_id, runner, getattr(options, "log_dir", None), view)
    if rows is None:
        return False
    if view.silent:
        print(f"slurmtf: {view.note()}", file=sys.stderr)
    if getattr(options, "hparams", False):
        write_rows(job_id, rows)  # for `slurmtf tensorboard JOB`'s HParams table
    rows = sort_rows(rows, getattr(options, "sort", None))
    if getattr(options, "json", False):
        print(render_json(job_id, rows))
    elif getattr(options, "csv", False):
        sys.stdout.write(render_csv(rows))
    else:
        print(render_table(job_id, rows))
    return True


def main(argv: Sequence[str] | None = None, runner: Runner = default_runner) -> int:
    """``[JOB, options...]`` -> exit status (2 on usage errors)."""

    def body(options: argparse.Namespace) -> int:
        if not options.job.isdigit():
            raise InputError("JOB", options.job, "is not a job array id", "e.g. 1234")
        if not print_sweep(options.job, options, runner):
            raise InputError(
                "JOB",
                options.job,
                "is not a job array Slurm or the record of submitted jobs knows",
                f"see `slurmtf status {options.job}` for a single job",
            )
        return 0

    return run_command(PROGRAM, _parser(), argv, body)
