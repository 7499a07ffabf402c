"""``slurmtf plot JOB [--out FILE.png]``: loss, accuracy and examples/s against step.

A finished or running job, or a sweep (one curve per point, its parameters in the
legend). Needs matplotlib: ``pip install 'slurmtf[plot]'``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from slurmtf.cli import ArgumentParser, add_flag, run_command
from slurmtf.errors import InputError
from slurmtf.slurm.runner import Runner, default_runner

PROGRAM = "slurmtf plot"


def main(argv: Sequence[str] | None = None, runner: Runner = default_runner) -> int:
    parser = ArgumentParser(prog=PROGRAM, description=__doc__)
    parser.add_argument("job", metavar="JOB", help="a Slurm job id, e.g. 1234 or 1234_3")
    add_flag(parser, "out", metavar="FILE", help="the PNG to write (default JOB.png)")
    add_flag(parser, "log_dir", metavar="DIR", help="the job's log folder (found by default)")
    return run_command(PROGRAM, parser, argv, lambda args: _plot(args, runner))


def _plot(args: argparse.Namespace, runner: Runner) -> int:
    from slurmtf.monitor.plot import render, runs_of, series_of
    from slurmtf.monitor.status import locate

    job_id = args.job
    if not job_id.replace("_", "").isdigit():
        raise InputError("JOB", job_id, "is not a Slurm job id", "e.g. 1234 or 1234_3 (array task)")
    place = locate(job_id, runner, args.log_dir)
    runs = runs_of(place)
    if not runs:
        raise InputError(
            "JOB", job_id, f"has no logs in {place.log_dir} (found via {place.source})",
            "pass --log_dir= as given to submit or as LOG_DIR to the job script",
        )  # fmt: skip
    series = [series_of(run, label) for run, label in runs]
    out = Path(args.out or f"{job_id}.png")
    what = f"sweep {job_id}, {len(series)} points" if len(series) > 1 else f"job {job_id}"
    render(series, out, what)
    print(f"slurmtf: wrote {out} ({what})")
    return 0
