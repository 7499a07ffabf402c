"""Training throughput of the bundled models through their real entry points.

Each case runs ``python -m models.<name> ... --use_synthetic_data`` as one worker for
``2 * interval`` steps and reads the chief's progress line of the SECOND interval, so
tracing and compilation are left out. Prints one JSON line per case and a table.

    python -m benchmarks.bench_models            # CPU: MNIST, ResNet-20/56, ResNet-50
    python -m benchmarks.bench_models --gpu      # GPU: bigger batches, bf16/fp16 + XLA
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from benchmarks import harness, protocol
from benchmarks.harness import REPO, JSONDict
from benchmarks.protocol import Benchmark, Options

# (name, module, flags, steps per interval)
CPU_CASES: list[tuple[str, str, list[str], int]] = [
    ("mnist b100 fp32", "mnist", ["--batch_size=100"], 20),
    ("resnet20 b128 fp32", "resnet", ["--resnet_size=20", "--batch_size=128"], 5),
    ("resnet56 b128 fp32", "resnet", ["--resnet_size=56", "--batch_size=128"], 3),
    ("resnet50 b32 fp32", "resnet", ["--resnet_size=50", "--batch_size=32"], 2),
]
GPU_CASES: list[tuple[str, str, list[str], int]] = [
    ("mnist b1024 bf16+xla", "mnist", ["--batch_size=1024", "--dtype=bf16", "--enable_xla"], 100),
    (
        "resnet56 b512 bf16+xla",
        "resnet",
        ["--resnet_size=56", "--batch_size=512", "--dtype=bf16", "--enable_xla"],
        50,
    ),
    (
        "resnet50 b256 bf16+xla",
        "resnet",
        ["--resnet_size=50", "--batch_size=256", "--dtype=bf16", "--enable_xla"],
        50,
    ),
    (
        "resnet50 b256 fp16+xla",
        "resnet",
        ["--resnet_size=50", "--batch_size=256", "--dtype=fp16", "--enable_xla"],
        50,
    ),
    ("resnet50 b256 fp32", "resnet", ["--resnet_size=50", "--batch_size=256"], 30),
]


def run_case(module: str, flags: list[str], interval: int, threads: int) -> dict[str, float]:
    """examples/s and ms/step of the second progress interval of one run."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}
    argv = [
        sys.executable,
        "-m",
        f"models.{module}",
        *flags,
        "--use_synthetic_data",
        f"--train_steps={2 * interval}",
        f"--log_every={interval}",
        "--eval_steps=1",
    ]
    if threads:
        argv.append(f"--num_threads={threads}")
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{proc.stderr[-2000:]}")
    rates = [float(e["examples_per_sec"]) for e in harness.progress_events(proc.stdout)]
    batch = next(int(f.split("=")[1]) for f in flags if f.startswith("--batch_size="))
    rate = rates[-1]
    return {
        "examples_per_s": rate,
        "ms_per_step": 1000 * batch / rate,
        "wall_s": time.monotonic() - started,
    }


def run(options: Options) -> JSONDict:
    """Every case of the CPU (or ``--gpu``) list whose name holds ``--only``."""
    cases = GPU_CASES if options.flag("gpu", False) else CPU_CASES
    only, threads = options.flag("only", ""), options.flag("threads", 0)
    rows = []
    for name, module, flags, interval in cases:
        if only and only not in name:
            continue
        every = max(1, interval // 2) if options.quick else interval
        result = run_case(module, flags, every, threads)
        rows.append({"case": name, **result, "load": os.getloadavg()[0]})
    return {"name": "models", "threads": threads, "cases": rows}


def markdown(result: JSONDict) -> str:
    table = [[r["case"], r["examples_per_s"], r["ms_per_step"]] for r in result["cases"]]
    return harness.markdown_table(["case", "examples/s", "ms/step"], table)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", action="store_true", help="the GPU cases")
    parser.add_argument("--only", default="", help="run cases whose name contains this")
    parser.add_argument("--threads", type=int, default=0, help="--num_threads for TF (0 = all)")


BENCHMARK = protocol.declare(__name__, Benchmark(
    "models", "Training throughput of the bundled models (one worker)", run, markdown,
    description=__doc__, arguments=_arguments,
))  # fmt: skip
