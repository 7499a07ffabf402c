"""``slurmtf run`` / ``python -m slurmtf.run``: run an unmodified script on this task.

``python -m slurmtf.run SCRIPT [ARGS...]`` or ``python -m slurmtf.run -m MODULE [ARGS...]``
runs what ``python SCRIPT ARGS`` would, after resolving this task, exporting ``TF_CONFIG``,
narrowing its GPUs and arming slurmtf's TensorFlow and Keras fixes
(:mod:`slurmtf.run`). Everything after SCRIPT (or MODULE) belongs to the script.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

from slurmtf.cli import ArgumentParser, report_error
from slurmtf.errors import InputError, SlurmtfError, UsageError
from slurmtf.runtime.rank.script import Target, launch_script

PROGRAM = "slurmtf run"

EPILOG = """\
what it does before the script's first line:
  TF_CONFIG          exported for this task (rank = SLURM_PROCID; every Slurm variable and
                     SLURMTF_PORT_BASE / SLURMTF_ADDRESS_TEMPLATE as `slurmtf resolve` reads them)
  GPUs               CUDA_VISIBLE_DEVICES narrowed to this task's share
  flat memory        TensorFlow's collective keys reused (once `import tensorflow` is done)
  --cluster_flags    --worker_hosts=H1:P1,H2:P2,... --task_index=N appended to ARGS, for
                     scripts that take the cluster as TensorFlow's official models do
  Keras 3 fit        model.fit/evaluate/predict and the file-writing callbacks fixed for
                     MultiWorkerMirroredStrategy (once `import keras` is done; not with
                     TF_USE_LEGACY_KERAS=1, where tf_keras needs no fix)

examples:
  srun python -m slurmtf.run train.py --epochs=3
  srun python -m slurmtf.run --cluster_flags resnet_main.py   (+ --worker_hosts, --task_index)
  sbatch jobs/train.sbatch train.py --epochs=3        (runs this launcher on every task)
  CLUSTER_FLAGS=1 sbatch jobs/train.sbatch resnet_main.py   (the same with --cluster_flags)
  slurmtf submit --nodes=2 --command="python train.py --epochs=3"
"""


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m slurmtf.run",
        usage="python -m slurmtf.run [-h] [--cluster_flags] (SCRIPT | -m MODULE) [ARGS...]",
        description="Run a training script unchanged on this Slurm task, as `python SCRIPT` "
        "would, with TF_CONFIG and slurmtf's fixes in place.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m")
    parser.add_argument(
        "--cluster_flags",
        action="store_true",
        help="append --worker_hosts=H1:P1,... --task_index=N (this task's place, as "
        "TensorFlow's official models take it) to the script's arguments",
    )
    return parser


def parse_target(argv: Sequence[str]) -> Target:
    """``[--cluster_flags] (SCRIPT | -m MODULE) [ARGS...]``: the launcher's arguments end
    at the script."""
    args = list(argv)
    with_flags = args[:1] in (["--cluster_flags"], ["--cluster-flags"])
    if with_flags:
        args = args[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    return dataclasses.replace(_script(args), cluster_flags=with_flags)


def _script(args: list[str]) -> Target:
    usage = _parser().format_usage()
    if not args:
        raise UsageError("a SCRIPT or -m MODULE is required", usage)
    if args[0] == "-m":
        if len(args) < 2:
            raise UsageError("-m needs a MODULE", usage)
        return Target(args[1], tuple(args[2:]), module=True)
    if args[0].startswith("-m"):  # -mpkg.train, as python accepts it
        return Target(args[0][2:], tuple(args[1:]), module=True)
    if args[0].startswith("-"):
        raise UsageError(f"unknown option {args[0]!r}", usage)
    if not Path(args[0]).is_file():
        raise InputError(
            "SCRIPT", args[0], "is not a file",
            "give a path relative to the directory the task runs in, or -m MODULE",
        )  # fmt: skip
    return Target(args[0], tuple(args[1:]))


def main(argv: Sequence[str] | None = None) -> int:
    """The script's exit status; 2 with one line for bad arguments or Slurm variables."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        _parser().print_help()
        return 0
    try:
        return launch_script(parse_target(args))
    except SlurmtfError as exc:
        return report_error(PROGRAM, exc)


if __name__ == "__main__":
    sys.exit(main())
