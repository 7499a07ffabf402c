"""The one shape of a benchmark module, its one command line, and its one plotting prologue.

A module ends with ``BENCHMARK = protocol.declare(__name__, Benchmark(...))``: a name, a
title, ``run(options) -> dict`` (the measured result, JSON-ready), ``markdown(result) ->
str`` (its table), and optionally ``plot(result, out_dir) -> [paths]``, extra command-line
flags and a hidden ``--worker`` entry for the processes it starts.
``python -m benchmarks.<module>`` and ``python -m benchmarks.run_all`` both drive a module
through this protocol only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import JSONDict


@dataclass(frozen=True)
class Options:
    """What a benchmark's ``run`` is given: size, where logs go, its own flags."""

    quick: bool = False
    log_dir: Path | None = None  # per-process logs of the workers it starts
    out_dir: Path | None = None  # where results are written (and earlier ones read)
    args: argparse.Namespace = field(default_factory=argparse.Namespace)

    def flag(self, name: str, default: Any) -> Any:
        """The benchmark's own flag ``name``, or ``default`` when run without it."""
        return getattr(self.args, name, default)


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: how to run it and how to show its result."""

    name: str  # results go to NAME.json
    title: str  # its section heading in the report
    run: Callable[[Options], JSONDict]
    markdown: Callable[[JSONDict], str]
    plot: Callable[[JSONDict, Path], list[Path]] | None = None
    description: str = ""  # the module's docstring: --help text
    arguments: Callable[[argparse.ArgumentParser], None] | None = None  # its own flags
    # With the hidden --worker flag, the module's processes run this instead of ``run``.
    worker: Callable[[argparse.Namespace], int] | None = None


def declare(module: str, bench: Benchmark) -> Benchmark:
    """A module's ``BENCHMARK = declare(__name__, Benchmark(...))``: run as ``python -m
    benchmarks.<module>`` (``module`` is ``__main__``), it runs the benchmark and exits."""
    if module == "__main__":
        sys.exit(main(bench))
    return bench


def parser(bench: Benchmark) -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(description=bench.description.split("\n\n")[0])
    out.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    out.add_argument("--out", type=Path, help="write NAME.json, NAME.md and the plots here")
    out.add_argument(
        "--record",
        type=lambda text: record_name(bench.name, text),
        help=f"write RECORD.json... instead of NAME: a variant kept beside the others, "
        f"named {bench.name}_WHAT or {bench.name}-WHAT (e.g. {bench.name}_22.05)",
    )
    if bench.worker is not None:
        out.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    if bench.arguments is not None:
        bench.arguments(out)
    return out


def record_name(name: str, record: str) -> str:
    """A variant's record name (``batch_host_22.05``): the benchmark's ``name``, then ``_``
    or ``-`` and a word, so that every file in docs/benchmarks/ names its producer."""
    if not re.fullmatch(rf"{re.escape(name)}(?:[_-][\w.-]+)?", record):
        raise argparse.ArgumentTypeError(
            f"{record!r} does not name this benchmark. HINT: {name}_WHAT or {name}-WHAT"
        )
    return record


def main(bench: Benchmark, argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.<module>``: run it, print JSON and its table, maybe write them."""
    args = parser(bench).parse_args(argv)
    if bench.worker is not None and args.worker:
        return bench.worker(args)
    result = bench.run(Options(quick=args.quick, out_dir=args.out, args=args))
    result.setdefault("machine", harness.machine_info())
    print(json.dumps(result, indent=1))
    if not result.get("pending") and not result.get("error"):
        print(bench.markdown(result))
    if args.out is not None:
        write(bench, result, args.out, args.record)
    return 0


def write(
    bench: Benchmark, result: JSONDict, out_dir: Path, record: str | None = None
) -> list[Path]:
    """``NAME.json``, ``NAME.md`` and the plots of ``result`` in ``out_dir`` (``record``:
    ``RECORD.json`` and ``RECORD.md`` instead)."""
    name = record or bench.name
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    if result.get("pending") or result.get("error"):
        return []
    (out_dir / f"{name}.md").write_text(bench.markdown(result) + "\n")
    return [] if bench.plot is None else bench.plot(result, out_dir)


@contextlib.contextmanager
def figure(
    path: Path, size: tuple[float, float] = (6.4, 4.0), *, rows: int = 1, dpi: int = 120
) -> Iterator[Any]:
    """Matplotlib axes (headless backend; ``rows`` > 1: a column of them sharing x) whose
    figure is saved to ``path`` when the block ends without an error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, 1, figsize=size, sharex=rows > 1)
    try:
        yield axes
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
