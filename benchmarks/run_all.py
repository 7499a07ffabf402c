"""Run the slurmtf benchmarks and write JSON, a Markdown report and PNG plots.

    python -m benchmarks.run_all [--quick] [--only NAME[,NAME...]] [--out DIR]

Each benchmark writes ``DIR/NAME.json`` (default ``docs/benchmarks/``); the report
``DIR/results.md`` is then rebuilt from every JSON file present, so ``--only`` refreshes
one section without losing the others. Per-process logs go to ``runs/benchmarks/``.
Benchmarks, in this order: resolver, launch, scaling, allreduce, links, breakdown, models,
gpu, firewall, check, stage, evaluator, restarts, recovery, width, sweep, tf_releases,
projection (each module declares a ``BENCHMARK``, see protocol.py).
``--quick`` uses small sizes; the numbers in docs/BENCHMARKS.md come from a full run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from benchmarks import harness
from benchmarks.harness import JSONDict
from benchmarks.protocol import Benchmark, Options

MODULES = {
    "resolver": "benchmarks.bench_resolver",
    "launch": "benchmarks.bench_launch",
    "scaling": "benchmarks.bench_scaling",
    "allreduce": "benchmarks.bench_allreduce",
    "links": "benchmarks.bench_links",
    "breakdown": "benchmarks.bench_breakdown",
    "models": "benchmarks.bench_models",
    "checkpoint": "benchmarks.bench_checkpoint",
    "gpu": "benchmarks.bench_gpu",
    "firewall": "benchmarks.bench_firewall",
    "check": "benchmarks.bench_check",
    "stage": "benchmarks.bench_stage",
    "evaluator": "benchmarks.bench_evaluator",
    "restarts": "benchmarks.bench_restarts",
    "recovery": "benchmarks.bench_recovery",
    "goodput": "benchmarks.bench_goodput",
    "width": "benchmarks.bench_width",
    "sweep": "benchmarks.bench_sweep",
    "tf_releases": "benchmarks.bench_tf_releases",
    "batch_host": "benchmarks.bench_batch_host",
    "projection": "benchmarks.projection",  # last: it reads links, breakdown and gpu
}
NAMES = tuple(MODULES)
DEFAULT_OUT = harness.REPO / "docs" / "benchmarks"
LOG_ROOT = harness.REPO / "runs" / "benchmarks"


def benchmark(name: str) -> Benchmark:
    """The ``BENCHMARK`` a module declares (see benchmarks/protocol.py)."""
    bench: Benchmark = importlib.import_module(MODULES[name]).BENCHMARK
    return bench


def parse_only(text: str | None) -> list[str]:
    """``--only`` value to benchmark names, in the canonical order; error on unknown."""
    if not text:
        return list(NAMES)
    wanted = [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in NAMES]
    if unknown:
        raise ValueError(f"--only={text!r}: unknown {unknown}. HINT: one of {', '.join(NAMES)}")
    return [n for n in NAMES if n in wanted]


def run_one(name: str, quick: bool, out_dir: Path) -> JSONDict:
    start = time.perf_counter()
    try:
        options = Options(quick=quick, log_dir=LOG_ROOT / name, out_dir=out_dir)
        result = benchmark(name).run(options)
    except Exception as exc:  # one failing benchmark must not stop the rest
        traceback.print_exc()
        result = {"name": name, "error": f"{type(exc).__name__}: {exc}"}
    result.setdefault("name", name)
    result["wall_s"] = round(time.perf_counter() - start, 1)
    result["quick"] = quick
    result["machine"] = harness.machine_info()
    path = out_dir / f"{name}.json"
    if result.get("pending") and path.exists():
        old = json.loads(path.read_text())
        if not old.get("pending") and not old.get("error"):
            print(f"{name}: pending here; keeping the measured {path}", file=sys.stderr)
            return old  # type: ignore[no-any-return]
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return result


def render_section(name: str, result: JSONDict, out_dir: Path) -> str:
    bench = benchmark(name)
    lines = [f"## {bench.title}\n"]
    machine = result.get("machine", {})
    lines.append(
        f"_{machine.get('date_utc', '?')}, {'quick' if result.get('quick') else 'full'} run, "
        f"{result.get('wall_s', '?')} s, load average {machine.get('load_average', '?')}_\n"
    )
    if result.get("error"):
        lines.append(f"**Failed:** `{result['error']}`\n")
        return "\n".join(lines) + "\n"
    if result.get("pending"):
        lines.append(f"**PENDING:** {result.get('reason', '')}\n")
        lines.append(f"```bash\n{result.get('command', '')}\n```\n")
        return "\n".join(lines) + "\n"
    lines.append(bench.markdown(result))
    if bench.plot is not None:
        try:
            paths = bench.plot(result, out_dir)
        except Exception as exc:  # a plot failure must not lose the table
            lines.append(f"(plot failed: {exc})\n")
        else:
            lines += [f"![{Path(p).stem}]({Path(p).name})\n" for p in paths]
    return "\n".join(lines) + "\n"


def render_report(out_dir: Path) -> str:
    """``results.md`` from every ``NAME.json`` in ``out_dir``, in the canonical order."""
    parts = ["# slurmtf benchmark results (generated by `python -m benchmarks.run_all`)\n\n"]
    machine = None
    for name in NAMES:
        path = out_dir / f"{name}.json"
        if not path.exists():
            continue
        result = json.loads(path.read_text())
        machine = machine or result.get("machine")
        parts.append(render_section(name, result, out_dir))
    if machine:
        facts = ", ".join(f"{k}: {v}" for k, v in machine.items())
        parts.insert(1, f"Machine: {facts}\n\n")
    return "".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run_all",
        description="Run the slurmtf benchmarks; write JSON, results.md and PNG plots.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--only", metavar="NAME[,NAME]", help=f"run only these: {', '.join(NAMES)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument(
        "--report_only",
        action="store_true",
        help="rebuild results.md and plots from the JSON files only",
    )
    args = parser.parse_args(argv)
    try:
        names = parse_only(args.only)
    except ValueError as exc:
        parser.print_usage(sys.stderr)
        print(str(exc), file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    if not args.report_only:
        for name in names:
            print(f"== {name}", file=sys.stderr, flush=True)
            result = run_one(name, args.quick, args.out)
            if result.get("error"):
                failed.append(name)
            print(
                f"== {name}: {result.get('error') or 'ok'} ({result['wall_s']} s)",
                file=sys.stderr,
                flush=True,
            )
    (args.out / "results.md").write_text(render_report(args.out))
    print(f"wrote {args.out / 'results.md'}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
