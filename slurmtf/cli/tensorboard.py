"""``slurmtf tensorboard JOB|DIR``: TensorBoard over a job's runs, reached through ssh.

JOB is a Slurm job id: its summary folders are found like ``slurmtf status`` finds its
logs (a job array: every task's run, named by its parameters, and the sweep's HParams
table). DIR is a folder of summaries (a ``--model_dir``, a TensorBoard callback's
``log_dir``). TensorBoard listens on a free port of localhost (``--port``, ``--bind``);
the ``ssh -L`` line to run on a laptop is printed, then it runs until Ctrl-C. It works
while the job runs (TensorBoard reloads; a job array's tasks that start later, and its
HParams table, are looked up again every 30 s) and after it ends. Needs TensorBoard:
``pip install 'slurmtf[tensorboard]'``; TensorFlow is not imported.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from pathlib import Path

from slurmtf.cli import ArgumentParser, add_flag, run_command
from slurmtf.errors import InputError
from slurmtf.monitor import board
from slurmtf.monitor.board import Run
from slurmtf.monitor.hparams import write_rows
from slurmtf.monitor.slurm_view import SlurmView, ask_slurm
from slurmtf.monitor.sweeps import collect
from slurmtf.slurm.runner import Runner, default_runner

PROGRAM = "slurmtf tensorboard"


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROGRAM, description=__doc__)
    parser.add_argument("target", metavar="JOB|DIR", help="a Slurm job id or a summary folder")
    add_flag(parser, "port", type=int, default=0, help="the port (default: a free one)")
    add_flag(parser, "bind", default="localhost", help="the address (default localhost)")
    add_flag(parser, "log_dir", metavar="DIR", help="the job's log folder (found by default)")
    add_flag(
        parser, "dry_run", action="store_true",
        help="print the TensorBoard command line and the ssh line, start nothing",
    )  # fmt: skip
    return parser


def sweep_board(job_id: str, runner: Runner, log_dir: str | None, view: SlurmView) -> Run | None:
    """A job array's HParams run (written now, unless unchanged), or None for a job."""
    folder = write_rows(job_id, collect(job_id, runner, log_dir, view) or [])
    return Run("hparams", folder) if folder is not None else None


def runs_for(target: str, runner: Runner, log_dir: str | None) -> list[Run]:
    """The runs of a job id or a folder."""
    if not target.replace("_", "").isdigit() or Path(target).is_dir():
        return board.folder_runs(target)
    view = SlurmView(None) if log_dir else ask_slurm(target, runner)
    runs, _ = board.job_runs(target, runner, log_dir, view)
    extra = sweep_board(target, runner, log_dir, view) if target.isdigit() else None
    return [*runs, *([extra] if extra else [])]


def _tensorboard(args: argparse.Namespace, runner: Runner) -> int:
    if not 0 <= args.port < 65536:
        raise InputError("--port", args.port, "is not a port", "e.g. --port=6006, or 0: a free one")
    runs = runs_for(args.target, runner, args.log_dir)
    if not args.dry_run:
        board.check_installed()
    port = args.port or board.free_port(args.bind)
    print(f"slurmtf: TensorBoard over {len(runs)} run(s): {', '.join(r.name for r in runs)}")
    if args.dry_run:
        spec = board.logdir_spec(runs)
        print(shlex.join(board.board_command(spec, port, args.bind, spec=True)))
    print(f"slurmtf: on your laptop run:  {board.ssh_line(port, args.bind)}")
    print(f"slurmtf: then open http://localhost:{port}/ (Ctrl-C stops TensorBoard)", flush=True)
    if args.dry_run:
        return 0
    links = board.Links.create()
    try:
        links.update(runs)
        command = board.board_command(str(links.folder), port, args.bind)
        again = None if Path(args.target).is_dir() else (
            lambda: runs_for(args.target, runner, args.log_dir)
        )  # fmt: skip
        return board.serve(command, links, again, lambda line: print(line, flush=True))
    finally:
        links.remove()


def main(argv: Sequence[str] | None = None, runner: Runner = default_runner) -> int:
    """``[JOB|DIR, options...]`` -> exit status (2 on usage errors)."""
    return run_command(PROGRAM, _parser(), argv, lambda args: _tensorboard(args, runner))
