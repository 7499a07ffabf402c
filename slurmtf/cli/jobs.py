"""``slurmtf status|logs|cancel JOB``: a job's state, its per-rank logs, cancelling it.

``logs`` shows a rank's stdout as a person reads it (event lines as text), then the
job's record of its batch side (a lost batch host, the supervisor's own end, with their
times); ``--json`` prints the raw event lines, ``--err`` the rank's stderr as written
(those record lines then go to stderr).

The logs are found through Slurm while it knows the job, then through the record of
submitted jobs (``$XDG_STATE_HOME/slurmtf/jobs.jsonl``); ``--log_dir`` overrides both.
When Slurm's controller does not answer (maintenance, a failover, a machine without
Slurm's configuration), ``status`` and ``logs`` answer from that record and the logs,
with one line saying Slurm did not answer; ``cancel`` retries for a few seconds, then
says what it asked.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from slurmtf.cli import ArgumentParser, add_flag, report_error
from slurmtf.cli.sweep import print_sweep
from slurmtf.errors import InputError, SlurmtfError, UsageError
from slurmtf.monitor.console import render_lines
from slurmtf.monitor.slurm_view import SlurmView, ask_slurm
from slurmtf.monitor.status import follow_rank, locate, status_lines
from slurmtf.runtime.recovery.record import batch_side_lines, read_record
from slurmtf.slurm.controller import patient
from slurmtf.slurm.runner import Runner, default_runner

COMMANDS = ("status", "logs", "cancel")


def _parser(command: str) -> ArgumentParser:
    parser = ArgumentParser(prog=f"slurmtf {command}", description=__doc__)
    parser.add_argument("job", metavar="JOB", help="a Slurm job id, e.g. 1234 or 1234_3")
    if command == "cancel":
        return parser
    add_flag(parser, "log_dir", metavar="DIR", help="the job's log folder (found by default)")
    if command == "status":
        _sweep_flags(parser)
    if command == "logs":
        parser.add_argument("--rank", type=int, default=0, help="which rank (default 0)")
        parser.add_argument("--err", action="store_true", help="its stderr, not its stdout")
        parser.add_argument(
            "--json", action="store_true", help="the raw event lines, not the human text"
        )
        parser.add_argument("--follow", action="store_true", help="until the job ends")
    return parser


def _sweep_flags(parser: ArgumentParser) -> None:
    """``slurmtf sweep``'s table flags, for a job array's status."""
    add_flag(parser, "sort", metavar="COLUMN", help="job array: best first by this column")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="job array: the table as JSON")
    form.add_argument("--csv", action="store_true", help="job array: the table as CSV")


def main(argv: Sequence[str] | None = None, runner: Runner = default_runner) -> int:
    """``[status|logs|cancel, JOB, options...]`` -> exit status (2 on usage errors)."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else ""
    try:
        if command not in COMMANDS:
            raise UsageError(f"unknown command {command!r}", f"one of {', '.join(COMMANDS)}")
        options = _parser(command).parse_args(args[1:])
        return _run(command, options, runner)
    except SlurmtfError as exc:
        return report_error(f"slurmtf {command}".rstrip(), exc)


def _run(command: str, options: argparse.Namespace, runner: Runner) -> int:
    job_id = options.job
    if not job_id.replace("_", "").isdigit():
        raise InputError("JOB", job_id, "is not a Slurm job id", "e.g. 1234 or 1234_3 (array task)")
    if command == "cancel":
        patient(runner)(["scancel", job_id])
        print(f"slurmtf: cancelled job {job_id}")
        return 0
    if command == "status":
        view = ask_slurm(job_id, runner)  # once: a silent controller costs one wait
        if print_sweep(job_id, options, runner, view):
            if not (options.json or options.csv):
                print(f"tensorboard: slurmtf tensorboard {job_id} (every point, HParams table)")
            return 0  # a job array: one row per point (slurmtf.cli.sweep)
        place = locate(job_id, runner, options.log_dir, view)
        print("\n".join(status_lines(job_id, runner, place, view)))
        return 0
    view = SlurmView(None) if options.log_dir else ask_slurm(job_id, runner)
    if view.silent:
        print(f"slurmtf logs: {view.note()}", file=sys.stderr)
    place = locate(job_id, runner, options.log_dir, view)
    if options.rank < 0:
        raise InputError("--rank", options.rank, "is not a rank", "e.g. --rank=0")
    path = place.rank_log(options.rank, "err" if options.err else "out")
    raw = options.err or options.json
    if options.follow:
        return follow_rank(job_id, path, runner, raw=raw)
    if not path.exists():
        raise InputError(
            "JOB", job_id, f"has no log at {path} (found via {place.source})",
            "pass --log_dir= as given to submit or as LOG_DIR to the job script",
        )  # fmt: skip
    text = path.read_text(errors="replace")
    if raw:
        sys.stdout.write(text)
    else:
        sys.stdout.writelines(line + "\n" for line in render_lines(text.splitlines()))
    said = batch_side_lines(read_record(place.log_dir, job_id))  # a lost batch host, ...
    print("".join(f"slurmtf: {line}\n" for line in said), end="", file=sys.stderr if raw else None)
    return 0
