"""``slurmtf data sample-mnist|fetch|verify``: write, download or check a ``--data_dir``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from slurmtf.cli import ArgumentParser, run_command
from slurmtf.datasets import manifest

EPILOG = """examples:
  slurmtf data sample-mnist runs/data/mnist-sample   # real digits, offline (scikit-learn)
  slurmtf data fetch mnist /shared/data/mnist        # full MNIST (internet on this node)
  slurmtf data fetch cifar10 /shared/data/cifar10 --mirror=https://host/copy/
  slurmtf data verify /shared/data/mnist             # check every file's SHA-256
  slurmtf data stage /shared/data/mnist              # verified copy on this node's scratch
then: DATA_DIR=DIR sbatch mnist.sbatch, or --data_dir=DIR to a model or slurmtf submit"""


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="slurmtf data",
        description="Data sets for the bundled models, in their official formats, with a "
        "MANIFEST.json of SHA-256 checksums, source and licence that the readers check.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sample = commands.add_parser(
        "sample-mnist",
        help="write 1,797 real handwritten digits (UCI, via scikit-learn) as MNIST IDX files",
    )
    sample.add_argument("dir", type=Path, metavar="DIR", help="folder to write (created)")
    fetch = commands.add_parser(
        "fetch", help="download full MNIST or CIFAR-10 and verify the published checksums"
    )
    fetch.add_argument("dataset", choices=["mnist", "cifar10"], help="which data set")
    fetch.add_argument("dir", type=Path, metavar="DIR", help="folder to fill (created)")
    fetch.add_argument("--mirror", default=None, help="base URL of a copy (default: published)")
    fetch.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    verify = commands.add_parser("verify", help="check every file against DIR/MANIFEST.json")
    verify.add_argument("dir", type=Path, metavar="DIR", help="a folder written by this command")
    stage = commands.add_parser(
        "stage",
        help="copy DIR to this node's scratch ($STAGE_DIR, $SLURM_TMPDIR, $TMPDIR) and "
        "verify it (once per node; a verified copy of this job is reused)",
    )
    stage.add_argument("dir", type=Path, metavar="DIR", help="a folder with a MANIFEST.json")
    commands.add_parser("unstage", help="remove this job's staged copies on this node")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_command("slurmtf data", _parser(), argv, _run)


def _run(args: argparse.Namespace) -> int:
    if args.command == "sample-mnist":
        from slurmtf.datasets.sample import write_mnist_sample

        write_mnist_sample(args.dir)
        print(f"wrote {args.dir}: {manifest.describe(manifest.verify_directory(args.dir))}")
    elif args.command == "fetch":
        from slurmtf.datasets.fetch import fetch

        fetch(
            args.dataset,
            args.dir,
            mirror=args.mirror,
            timeout=args.timeout,
            log=lambda line: print(line, file=sys.stderr),
        )
        print(f"fetched {args.dir}: {manifest.describe(manifest.verify_directory(args.dir))}")
    elif args.command in {"stage", "unstage"}:
        _stage(args)
    else:
        record = manifest.verify_directory(args.dir)
        print(f"{args.dir}: {len(record['files'])} files match {manifest.NAME}")
        print(f"data: {manifest.describe(record)}")
    return 0


def _stage(args: argparse.Namespace) -> None:
    """The ``staged``/``unstaged`` event line of this node (one task per node runs it)."""
    import os

    from slurmtf.contracts import ignore_warning_signals
    from slurmtf.datasets import stage
    from slurmtf.events import emit

    ignore_warning_signals()  # a step of the job: the copy or its removal must finish
    node = os.environ.get("SLURMD_NODENAME", "")
    if args.command == "unstage":
        emit("unstaged", node=node, path=str(stage.unstage(os.environ)))
        return
    done = stage.stage(args.dir, os.environ)
    emit(
        "staged", node=node, path=str(done.path), source=str(args.dir.resolve()),
        reused=done.reused, bytes=done.bytes, seconds=round(done.seconds, 3),
    )  # fmt: skip
