"""The entry point every bundled model shares: flags -> layout -> strategy -> loop.

``main_for`` parses absl flags from ``argv`` (without the program name), resolves this
task's place in the Slurm job through :mod:`slurmtf.resolver`, and runs the loop. Usage
errors print one ``NAME='value': problem. HINT: fix`` line on stderr and return 2.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

from absl import flags

from slurmtf.errors import InputError
from slurmtf.training.flags import TrainConfig, config_from_flags, define_flags
from slurmtf.training.loop import ModelSpec, RunInfo, run

FLAGS = flags.FLAGS
EXIT_USAGE = 2


def resolve_info() -> RunInfo:
    """This task's rank and peers, from the resolver (a single worker outside Slurm)."""
    try:
        resolver = importlib.import_module("slurmtf.resolver")
    except ImportError:  # the resolver is not in this checkout yet: run as one worker
        return RunInfo()
    layout = resolver.resolve()
    if not layout.is_single_worker:
        from slurmtf.ports import ensure_port_free

        ensure_port_free(layout.port)
    return RunInfo(
        rank=layout.task_index,
        num_workers=layout.num_workers,
        is_chief=layout.is_chief,
        workers=tuple(layout.workers),
        restart_count=int(getattr(layout, "restart_count", 0) or 0),
        layout=None if layout.is_single_worker else layout,
    )


def main_for(
    program: str,
    argv: Sequence[str] | None,
    make_spec: Callable[[TrainConfig], ModelSpec],
    *,
    default_batch_size: int,
    default_learning_rate: float,
    info: RunInfo | None = None,
) -> int:
    """Parse ``argv``, build the model's spec and train; returns the exit code."""
    define_flags()
    args = list(sys.argv[1:] if argv is None else argv)
    if "--help" in args or "-h" in args or "--helpfull" in args:
        print(f"usage: python -m {program} [--flag=value ...]\n")
        for module in (program, "slurmtf.training.flags"):
            text = FLAGS.module_help(module)
            if text:
                print(text + "\n")
        print("Also absl logging flags: --log_dir (per-rank log files), --verbosity.")
        return 0
    try:
        FLAGS([program, *args])
    except flags.Error as exc:
        print(f"{program}: {exc}. HINT: python -m {program} --help", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = config_from_flags(
            default_batch_size=default_batch_size,
            default_learning_rate=default_learning_rate,
        )
        spec = make_spec(config)
        return run(spec, config, info or resolve_info())
    except InputError as exc:
        print(f"{program}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        FLAGS.unparse_flags()
