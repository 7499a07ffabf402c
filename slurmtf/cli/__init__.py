"""The front ends: the ``slurmtf`` console script and one module per subcommand.

Libraries (:mod:`slurmtf.resolver`, :mod:`slurmtf.sandbox`, :mod:`slurmtf.datasets`, ...)
take values and raise :class:`~slurmtf.errors.SlurmtfError`; the modules here parse
arguments (argparse), call them and turn errors into exit codes through
:func:`report_error` (2: bad input, 1: anything else).

- ``resolve``: ``slurmtf resolve``: this task's TF_CONFIG.
- ``sandbox``: ``slurmtf sandbox up|status|down|env``: a local multi-node Slurm cluster.
- ``submit``: ``slurmtf submit``: a training job or a sweep, through submitit.
- ``jobs``: ``slurmtf status|logs|cancel JOB``.
- ``sweep``: ``slurmtf sweep JOB``: a sweep's results, one row per point.
- ``run``: ``slurmtf run``: an unmodified training script on this task.
- ``check``: ``slurmtf check``: which node or link slows an allocation.
- ``firewall``: ``slurmtf firewall --print-config``: how to install the per-job firewall.
- ``plot``: ``slurmtf plot JOB``: loss, accuracy and examples/s against step.
- ``tensorboard``: ``slurmtf tensorboard JOB|DIR``: TensorBoard over a job's runs, for ssh -L.
- ``data``: ``slurmtf data ...``: write, fetch, verify or stage a data set.
- ``job_scripts``: ``slurmtf job-scripts DIR``: the bundled sbatch scripts.
- ``serve``: ``slurmtf serve``: the ps and worker servers of a parameter-server job.
- ``job``: ``slurmtf job KIND``: the supervisor of a batch job (what job scripts hand over to).
- ``launch``: ``python -m slurmtf.launch``: what each task of a submitted job runs.
- ``watcher``: ``slurmtf watcher`` (hidden): the supervisor's watcher step.

May import: every other part of slurmtf; nothing imports this package but the
``python -m`` hand-overs of the entry modules and the models' ``main``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from slurmtf.contracts import EXIT_FAILURE, EXIT_USAGE
from slurmtf.errors import InputError, SlurmtfError, UsageError

# subcommand -> (module with `main(argv) -> int`, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "resolve": ("slurmtf.cli.resolve", "print TF_CONFIG for this Slurm task (--explain, --export)"),
    "sandbox": ("slurmtf.cli.sandbox", "start, inspect or stop a local multi-node Slurm cluster"),
    "submit": ("slurmtf.cli.submit", "submit a training job or a sweep (job array) with submitit"),
    "status": ("slurmtf.cli.jobs", "show the state of a job"),
    "sweep": ("slurmtf.cli.sweep", "a sweep's results: one row per point (--sort, --csv, --json)"),
    "logs": ("slurmtf.cli.jobs", "print or follow a job's per-rank logs"),
    "cancel": ("slurmtf.cli.jobs", "cancel a job"),
    "run": ("slurmtf.cli.run", "run an unmodified training script on this task (TF_CONFIG, fixes)"),
    "check": ("slurmtf.cli.check", "which node or link slows an allocation (--nodes=N to submit)"),
    "firewall": ("slurmtf.cli.firewall", "print how to install the per-job firewall (prolog)"),
    "plot": ("slurmtf.cli.plot", "draw a job's or a sweep's loss, accuracy and examples/s"),
    "tensorboard": (
        "slurmtf.cli.tensorboard",
        "TensorBoard over a job's or a sweep's runs (ssh -L)",
    ),
    "data": ("slurmtf.cli.data", "write the real-digit MNIST sample, fetch MNIST/CIFAR-10"),
    "job-scripts": ("slurmtf.cli.job_scripts", "write the sbatch job scripts into a folder"),
    "serve": ("slurmtf.cli.serve", "run a ps/worker server until the chief's script ends"),
    "job": ("slurmtf.cli.job", "supervise a batch job's steps (what the job scripts hand over to)"),
}

# Not listed (what slurmtf starts itself): name -> module.
HIDDEN: dict[str, str] = {
    "watcher": "slurmtf.cli.watcher",  # the watcher step (runtime/batch_host/watcher_step.py)
}

# Subcommands whose module takes the subcommand name as its first argument.
_PASS_NAME = {"status", "logs", "cancel"}


def report_error(program: str, exc: SlurmtfError) -> int:
    """Print ``program: message`` on stderr; the exit status for ``exc`` (2: bad input)."""
    print(f"{program}: {exc}", file=sys.stderr)
    return EXIT_USAGE if isinstance(exc, InputError | UsageError) else EXIT_FAILURE


def run_command(
    program: str,
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    body: Callable[[argparse.Namespace], int],
) -> int:
    """Parse ``argv`` (``sys.argv[1:]`` when None) and return ``body(args)``. A slurmtf
    error from either is one line on stderr and its exit status; once parsed, the line
    names the subcommand too (``args.command``, when the parser has subcommands)."""
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return report_error(program, exc)
    command = getattr(args, "command", None)
    try:
        return body(args)
    except SlurmtfError as exc:
        return report_error(f"{program} {command}" if command else program, exc)


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors raise :class:`~slurmtf.errors.UsageError` (one line,
    exit 2 through :func:`report_error`) instead of exiting the caller."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.format_usage())


def add_flag(container: Any, name: str, **options: Any) -> None:
    """``--name`` (as every slurmtf command and the models spell it) on an argparse parser
    or group, plus ``--na-me`` (sbatch's spelling), accepted but not listed in ``--help``."""
    container.add_argument(f"--{name}", **options)
    dashed = name.replace("_", "-")
    if dashed != name:
        container.add_argument(
            f"--{dashed}", dest=name, help=argparse.SUPPRESS, default=argparse.SUPPRESS,
            **{k: v for k, v in options.items() if k not in {"help", "default", "dest"}},
        )  # fmt: skip


def usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = ["usage: slurmtf COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in SUBCOMMANDS.items()]
    lines += ["", "Run `slurmtf COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if name in HIDDEN:
        hidden: int = importlib.import_module(HIDDEN[name]).main(rest)
        return hidden
    if name not in SUBCOMMANDS:
        print(
            f"slurmtf: unknown command {name!r}. HINT: one of {', '.join(SUBCOMMANDS)}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    module = importlib.import_module(SUBCOMMANDS[name][0])
    sub_argv = [name, *rest] if name in _PASS_NAME else rest
    result: int = module.main(sub_argv)
    return result
