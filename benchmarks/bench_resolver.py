"""Resolver speed: in-process resolve, CLI wall time and ``import slurmtf`` time.

Run ``python -m benchmarks.bench_resolver``. Targets (issue 2): a 4,096-node,
32,768-task step resolves in-process in < 50 ms and through the CLI in < 1 s. Prints the
result as JSON, then its table.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness, protocol
from benchmarks.protocol import Benchmark, Options
from slurmtf.local.step import LocalStep
from slurmtf.resolver import resolve

ROOT = Path(__file__).resolve().parents[1]
TASKS_PER_NODE = 8
SWEEP = (1, 8, 64, 512, 4096, 32768)
BIG = 32768
_IMPORT = "import time; t = time.perf_counter(); import slurmtf; print(time.perf_counter() - t)"


def step_env(ntasks: int, distribution: str = "block") -> dict[str, str]:
    """The variables of the last rank of a step with 8 tasks per node (fewer if smaller)."""
    per_node = min(TASKS_PER_NODE, ntasks)
    nodes = -(-ntasks // per_node)
    names = tuple(f"node{n:04d}" for n in range(1, nodes + 1))
    step = LocalStep(names, per_node, num_tasks=ntasks, nodelist=f"node[0001-{nodes:04d}]")
    env = step.rank_env(ntasks - 1) | {"SLURM_DISTRIBUTION": distribution}
    if distribution != "block":  # LocalStep places ranks in block order: leave placement out
        for name in ("SLURMD_NODENAME", "SLURM_NODEID", "SLURM_LOCALID"):
            del env[name]
    return env


def timed_ms(func: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(median, min) wall time of ``func`` in milliseconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        func()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), min(times)


def python_run(args: Sequence[str], env: dict[str, str]) -> str:
    """Run a fresh Python with only ``env`` (plus PATH and this checkout); its stdout."""
    full = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), **env}
    done = subprocess.run(
        [sys.executable, *args], env=full, cwd=ROOT, check=True, capture_output=True, text=True
    )
    return done.stdout


def measure(repeat: int, cli_repeat: int) -> dict[str, Any]:
    sweep: list[dict[str, Any]] = []
    for ntasks in SWEEP:
        for dist in ("block", "cyclic"):
            median, best = timed_ms(functools.partial(resolve, step_env(ntasks, dist)), repeat)
            sweep.append(
                {"tasks": ntasks, "distribution": dist, "median_ms": median, "min_ms": best}
            )
    layout = resolve(step_env(BIG))
    if layout.num_workers != BIG or len(set(layout.nodes)) != BIG // TASKS_PER_NODE:
        raise RuntimeError("the benchmark step did not resolve to 4,096 nodes x 8 tasks")
    big_env = step_env(BIG)
    cli = timed_ms(functools.partial(python_run, ["-m", "slurmtf.resolver"], big_env), cli_repeat)
    startup = timed_ms(functools.partial(python_run, ["-c", "pass"], {}), cli_repeat)
    imports = [float(python_run(["-c", _IMPORT], {})) * 1000 for _ in range(cli_repeat)]
    resolve_ms: float = next(
        r["median_ms"] for r in sweep if r["tasks"] == BIG and r["distribution"] == "block"
    )
    return {
        "sweep": sweep,
        "resolve_4096_nodes_32768_tasks_ms": resolve_ms,
        "cli_4096_nodes_32768_tasks_ms": cli[0],
        "python_startup_ms": startup[0],
        "import_slurmtf_ms": statistics.median(imports),
        "targets_met": resolve_ms < 50 and cli[0] < 1000,
    }


def run(options: Options) -> dict[str, Any]:
    """:func:`measure` at full or quick size, or with ``--repeat`` / ``--cli_repeat``."""
    quick = options.quick
    repeat = options.flag("repeat", None) or (5 if quick else 20)
    cli_repeat = options.flag("cli_repeat", None) or (2 if quick else 5)
    return {"name": "resolver", **measure(repeat=repeat, cli_repeat=cli_repeat)}


def markdown(result: dict[str, Any]) -> str:
    """Tables for bench_resolver's numbers (in-process sweep, CLI, import time)."""
    sweep = result.get("sweep", [])
    dists = list(dict.fromkeys(r["distribution"] for r in sweep))
    by_tasks: dict[int, dict[str, float]] = {}
    for r in sweep:
        by_tasks.setdefault(r["tasks"], {})[r["distribution"]] = r["median_ms"]
    text = harness.markdown_table(
        ["tasks (8 per node)", *[f"{d}: median ms" for d in dists]],
        [[t, *[by_tasks[t].get(d) for d in dists]] for t in sorted(by_tasks)],
    )
    rows = [
        ["resolve 4,096 nodes / 32,768 tasks in-process (target < 50 ms)",
         result.get("resolve_4096_nodes_32768_tasks_ms")],
        ["`python -m slurmtf.resolver` wall time for it (target < 1,000 ms)",
         result.get("cli_4096_nodes_32768_tasks_ms")],
        ["bare `python -c pass` start-up, for reference", result.get("python_startup_ms")],
        ["`import slurmtf` (no TensorFlow)", result.get("import_slurmtf_ms")],
    ]  # fmt: skip
    text += "\n" + harness.markdown_table(["measurement", "ms"], rows)
    if "targets_met" in result:
        text += f"\nTargets met: {'yes' if result['targets_met'] else 'NO'}.\n"
    return text


def table(results: dict[str, Any]) -> str:
    lines = [f"{'tasks':>6}  {'dist':<7} {'median ms':>10} {'min ms':>9}"]
    for row in results["sweep"]:
        lines.append(
            f"{row['tasks']:>6}  {row['distribution']:<7} "
            f"{row['median_ms']:>10.3f} {row['min_ms']:>9.3f}"
        )
    for key, value in results.items():
        if key != "sweep":
            lines.append(f"{key}: {value:.1f}" if isinstance(value, float) else f"{key}: {value}")
    return "\n".join(lines)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, help="runs per in-process timing (default 20)")
    parser.add_argument("--cli_repeat", type=int, help="runs per subprocess timing (default 5)")


BENCHMARK = protocol.declare(__name__, Benchmark(
    "resolver", "Resolver", run, markdown,
    description=__doc__, arguments=_arguments,
))  # fmt: skip
