"""How long a periodic save stops training: synchronous saves against asynchronous ones.

Each case runs ``python -m models.<name> ... --use_synthetic_data`` as one worker with a
save every ``every`` steps, once with ``--noasync_checkpoint`` and once with
``--async_checkpoint``, and reads the chief's ``checkpoint`` events: the seconds from the
save's start to the next step's (the batch norm statistics' sync, the copy, and for a
synchronous save the write). The first two saves are left out of the median (an
asynchronous save makes its host copies at the first and traces the copy at the second).

    python -m benchmarks.bench_checkpoint           # MNIST and ResNet-20 on CPU
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from benchmarks import harness, protocol
from benchmarks.harness import REPO, JSONDict
from benchmarks.protocol import Benchmark, Options

# (name, module, flags, steps between saves)
CASES: list[tuple[str, str, list[str], int]] = [
    ("mnist b100", "mnist", ["--batch_size=100"], 10),
    ("resnet20 b128", "resnet", ["--resnet_size=20", "--batch_size=128"], 3),
]
SAVES = 8  # per run; the first two are left out


def run_case(module: str, flags: list[str], every: int, background: bool) -> JSONDict:
    """The median and largest stall of one run's saves (the third on) and its step time."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}
    env.pop("TF_CONFIG", None)
    mode = "--async_checkpoint" if background else "--noasync_checkpoint"
    with tempfile.TemporaryDirectory(prefix="slurmtf-bench-ckpt-") as model_dir:
        argv = [
            sys.executable, "-m", f"models.{module}", *flags, "--use_synthetic_data",
            f"--train_steps={every * SAVES}", f"--checkpoint_every={every}",
            f"--log_every={every}", "--eval_steps=1", f"--model_dir={model_dir}", mode,
        ]  # fmt: skip
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{proc.stderr[-2000:]}")
    saves = harness.checkpoint_events(proc.stdout)
    stalls = [float(e["seconds"]) for e in saves[2:]]
    if not stalls:
        raise RuntimeError(f"{' '.join(argv)}: {len(saves)} checkpoint event(s), too few")
    rates = [float(e["examples_per_sec"]) for e in harness.progress_events(proc.stdout)]
    batch = next(int(f.split("=")[1]) for f in flags if f.startswith("--batch_size="))
    return {
        "asynchronous": bool(saves[-1].get("asynchronous")),
        "median_stall_s": harness.median(stalls),
        "max_stall_s": max(stalls),
        "first_save_s": float(saves[0]["seconds"]),
        "ms_per_step": 1000 * batch / rates[-1] if rates else None,
    }


def run(options: Options) -> JSONDict:
    """Every case, synchronous then asynchronous."""
    rows = []
    for name, module, flags, every in CASES:
        for background in (False, True):
            result = run_case(module, flags, every, background)
            rows.append({"case": name, **result, "load": os.getloadavg()[0]})
    return {"name": "checkpoint", "saves_per_run": SAVES, "cases": rows}


def markdown(result: JSONDict) -> str:
    table = [
        [r["case"], "asynchronous" if r["asynchronous"] else "synchronous",
         r["median_stall_s"] * 1000, r["max_stall_s"] * 1000, r["first_save_s"] * 1000,
         r["ms_per_step"]]
        for r in result["cases"]
    ]  # fmt: skip
    headers = ["case", "save", "median stall ms", "max stall ms", "first save ms", "ms/step"]
    return harness.markdown_table(headers, table)


BENCHMARK = protocol.declare(__name__, Benchmark(
    "checkpoint", "How long a save stops training (synchronous, asynchronous)", run, markdown,
    description=__doc__,
))  # fmt: skip
