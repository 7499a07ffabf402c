"""Resolver speed: in-process resolve, CLI wall time and ``import slurmtf`` time; and what a
wide step costs: TF_CONFIG's size and the ports' slots.

Run ``python -m benchmarks.bench_resolver``. Targets: a 4,096-node, 32,768-task step
resolves in-process in < 50 ms and through the CLI in < 1 s. For steps of 16 to 32,768
tasks (8 a node) it also keeps TF_CONFIG's size in bytes (the last rank's, as exported;
whether a child process can still be started with it: Linux refuses one environment
string above ``MAX_ARG_STRLEN``, 128 KiB), how many jobs' port slots the window holds
for a step of that size, how many job ids on either side share a port with it, and how
many attempts (restarts) go by before a rank's port repeats. Prints the result as JSON,
then its tables.
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
from slurmtf.cluster import ports
from slurmtf.local.step import LocalStep
from slurmtf.resolver import resolve

ROOT = Path(__file__).resolve().parents[1]
TASKS_PER_NODE = 8
SWEEP = (1, 8, 64, 512, 4096, 32768)
BIG = 32768
WIDTHS = (16, 256, 1024, 4096, 8192, 32768)
MAX_ARG_STRLEN = 32 * 4096  # Linux: the longest single argument or environment string
KEY = 667088  # a job id
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


def width(ntasks: int) -> dict[str, Any]:
    """TF_CONFIG's bytes and the port plan of a step of ``ntasks`` (8 a node)."""
    tf_config = resolve(step_env(ntasks)).tf_config_json()
    base = ports.derive_port_base(KEY, ntasks)
    span = ports.WINDOW_HIGH - ports.WINDOW_LOW
    slots = len({ports.derive_port_base(k, ntasks) for k in range(span // ports.SLOT_SIZE)})
    near = -(-ntasks // ports.SLOT_SIZE) - 1  # job ids on either side whose ports overlap
    firsts: list[int] = []
    while len(firsts) < 100_000:
        first = ports.attempt_base(base, ntasks, len(firsts))
        if first in firsts:
            break
        firsts.append(first)
    started = _starts_with(tf_config)
    return {"tasks": ntasks, "tf_config_bytes": len(tf_config),
            "bytes_per_worker": round(len(tf_config) / ntasks, 1), "child_starts": started,
            "port_slots": slots, "overlapping_neighbours": near,
            "attempts_before_a_port_repeats": len(firsts)}  # fmt: skip


def _starts_with(tf_config: str) -> bool:
    """Whether a child process starts with ``tf_config`` in its environment."""
    try:
        subprocess.run(["true"], env={"TF_CONFIG": tf_config}, check=True)
    except OSError:  # E2BIG: Argument list too long
        return False
    return True


def run(options: Options) -> dict[str, Any]:
    """:func:`measure` at full or quick size, or with ``--repeat`` / ``--cli_repeat``."""
    quick = options.quick
    repeat = options.flag("repeat", None) or (5 if quick else 20)
    cli_repeat = options.flag("cli_repeat", None) or (2 if quick else 5)
    result = {"name": "resolver", **measure(repeat=repeat, cli_repeat=cli_repeat)}
    return {**result, "width": [width(n) for n in WIDTHS], "max_arg_strlen": MAX_ARG_STRLEN}


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
    wide = [[r["tasks"], r["tf_config_bytes"], r["bytes_per_worker"], r["child_starts"],
             r["port_slots"], r["overlapping_neighbours"], r["attempts_before_a_port_repeats"]]
            for r in result.get("width", [])]  # fmt: skip
    if wide:
        text += "\n" + harness.markdown_table(
            ["tasks", "TF_CONFIG bytes", "per worker", "a child starts with it",
             "port slots", "job ids each side sharing ports", "attempts before a port repeats"],
            wide,
        )  # fmt: skip
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
