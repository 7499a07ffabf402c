"""``slurmtf job-scripts DIR | --list``: the bundled sbatch scripts, for an installed slurmtf."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from slurmtf.cli import ArgumentParser, run_command
from slurmtf.spec import bundled as jobscripts

EPILOG = """examples:
  slurmtf job-scripts --list      # what each script is for
  slurmtf job-scripts .           # write them here; then, from here:
  sbatch mnist.sbatch --train_steps=200
  sbatch train.sbatch my_train.py"""


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="slurmtf job-scripts",
        description="Write slurmtf's sbatch job scripts (the checkout's jobs/*.sbatch) into "
        "a folder to submit them from. A file there that differs is kept unless --force; "
        "an identical one is left as it is.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dir", type=Path, nargs="?", metavar="DIR", help="folder (created)")
    parser.add_argument("--list", action="store_true", help="what each script is for")
    parser.add_argument("--force", action="store_true", help="overwrite changed files")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_command("slurmtf job-scripts", _parser(), argv, _run)


def _run(args: argparse.Namespace) -> int:
    if args.list:
        scripts = jobscripts.bundled()
        width = max(len(script.name) for script in scripts)
        for script in scripts:
            print(f"{script.name:<{width}}  {script.summary}")
        return 0
    if args.dir is None:
        _parser().error("give DIR, the folder to write the scripts to, or --list")
    for path, action in jobscripts.write(args.dir, force=args.force):
        print(f"{action:<8}  {path}")
    print(f"then, from {args.dir}: sbatch mnist.sbatch (slurmtf job-scripts --list)")
    return 0
