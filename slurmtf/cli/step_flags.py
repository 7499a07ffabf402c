"""``slurmtf step-flags gpu-bind|whole-node|het-tasks``: srun flags for batch scripts of
one's own (the job scripts' supervisor calls :mod:`slurmtf.cluster.step_flags` itself).

``gpu-bind --tasks_per_node=N`` prints ``--gpu-bind=per_task:K`` when the training step
should bind each task to its own GPUs (the job chose no binding itself: neither
``SLURM_TRES_BIND``/``SLURM_TRES_PER_TASK``, Slurm 23.11+, nor ``SLURM_GPU_BIND``/
``SLURM_GPUS_PER_TASK`` name GPUs), ``whole-node`` prints ``--cpus-per-task=C`` when a
one-task-per-node step needs it to get the job's CPUs of each node (steps inherit
``--cpus-per-task`` from Slurm 23.11), ``het-tasks`` prints ``NAME=VALUE`` lines to export
before ``srun --het-group`` (the task count of each component Slurm left out). One a line,
nothing when none is needed: :mod:`slurmtf.cluster.step_flags`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from slurmtf.cli import ArgumentParser, add_flag, run_command
from slurmtf.cluster.env import read_slurm_env
from slurmtf.cluster.step_flags import gpu_bind_flags, het_task_counts
from slurmtf.errors import InputError

PROGRAM = "slurmtf step-flags"


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROGRAM, description=__doc__)
    parser.add_argument("command", choices=("gpu-bind", "het-tasks"))
    add_flag(parser, "tasks_per_node", default="1", help="the step's tasks on each node")
    return parser


def _body(args: argparse.Namespace) -> int:
    if args.command == "het-tasks":
        counts = het_task_counts(os.environ)
        sys.stdout.write("".join(f"{name}={value}\n" for name, value in counts.items()))
        return 0
    text = str(args.tasks_per_node).strip()
    if not text.isdigit() or int(text) < 1:
        raise InputError(
            "--tasks_per_node", args.tasks_per_node, "is not a task count",
            "pass the step's tasks per node, e.g. --tasks_per_node=4",
        )  # fmt: skip
    flags = gpu_bind_flags(read_slurm_env(), int(text))
    sys.stdout.write("".join(f"{flag}\n" for flag in flags))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(PROGRAM, _parser(), argv, _body)
