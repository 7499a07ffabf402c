"""What the workers gain with a sidecar evaluator: steps/s, in-loop evaluation vs evaluator.

Two workers train MNIST (synthetic data) on this machine, one local Slurm-like step, the
same steps, batch and evaluation cadence (every epoch, on the whole evaluation set):
``inloop`` has the workers pause to evaluate; ``sidecar`` adds a third task,
``SLURMTF_JOBS=worker:2,evaluator:1``, that evaluates each checkpoint while the workers
go on. The measure is the chief's training-loop rate (``N steps in S s``: every step,
pause and save from the first step to the last). The variants alternate (A B A B ...)
so that other load on the machine falls on both alike. The evaluator runs at ``nice 19``:
on a cluster it has a node of its own; here it shares the workers' cores.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import harness, protocol
from benchmarks.harness import JSONDict
from benchmarks.protocol import Benchmark, Options
from slurmtf.cluster.ports import free_port_base
from slurmtf.events import named, parse_events

DONE = '"event": "done"'
LOOP = re.compile(r"(\d+) steps in ([\d.]+) s")
BATCH = 200  # 30 steps per epoch of the 6,000 synthetic examples: evaluate every 30
PER_EPOCH = 6000 // BATCH
VARIANTS = ("inloop", "sidecar")


def model_args(steps: int, model_dir: Path) -> list[str]:
    return [
        "-m", "models.mnist", f"--batch_size={BATCH}", f"--train_steps={steps}",
        "--epochs_between_evals=1", "--log_every=20", "--num_threads=1",
        "--heartbeat_timeout=60", f"--model_dir={model_dir}",
    ]  # fmt: skip


def loop_rate(stderr: str) -> tuple[int, float]:
    """Steps and seconds of the chief's training loop, from its ``N steps in S s`` line."""
    found = LOOP.findall(stderr)
    if not found:
        raise ValueError("the chief logged no 'N steps in S s' line")
    steps, seconds = found[-1]
    return int(steps), float(seconds)


def run_variant(variant: str, steps: int, log_dir: Path | None) -> JSONDict:
    tasks = 3 if variant == "sidecar" else 2
    port_base = free_port_base(tasks)
    job_id = 810000 + port_base % 1000
    extra = {"SLURMTF_JOBS": "worker:2,evaluator:1"} if variant == "sidecar" else {}
    with tempfile.TemporaryDirectory(prefix=f"bench-evaluator-{variant}-") as tmp:
        argv = [harness.python(), *model_args(steps, Path(tmp) / "model")]
        argvs = [argv, argv] + ([["nice", "-n", "19", *argv]] if tasks == 3 else [])
        envs = [
            harness.clean_env({**harness.fake_slurm_env(rank, tasks, job_id, port_base), **extra})
            for rank in range(tasks)
        ]
        runs = harness.run_workers(
            argvs,
            envs,
            [None] * tasks,
            timeout=1500,
            log_dir=None if log_dir is None else log_dir / variant,
            done_marker=DONE,
            exit_grace=60.0,
        )
    harness.check_runs(runs, f"MNIST, {variant}")
    done_steps, seconds = loop_rate(runs[0].stderr)
    evals = {rank: [e["step"] for e in named(parse_events(r.stdout), "eval")] for rank, r in
             enumerate(runs)}  # fmt: skip
    return {
        "variant": variant,
        "steps": done_steps,
        "loop_s": seconds,
        "steps_per_s": done_steps / seconds,
        "eval_steps_by_rank": evals,
        "wall_s": runs[0].seconds,
    }


def run(options: Options) -> JSONDict:
    steps = 30 if options.quick else int(options.flag("steps", 60))
    rounds = 1 if options.quick else int(options.flag("rounds", 2))
    results: list[JSONDict] = []
    for _ in range(rounds):
        for variant in VARIANTS:
            results.append(run_variant(variant, steps, options.log_dir))
    rates = {v: [r["steps_per_s"] for r in results if r["variant"] == v] for v in VARIANTS}
    median = {v: harness.median(rates[v]) for v in VARIANTS}
    return {
        "model": "MNIST CNN, synthetic data",
        "workers": 2,
        "global_batch": BATCH,
        "steps": steps,
        "evaluations": steps // PER_EPOCH,
        "rounds": rounds,
        "runs": results,
        "median_steps_per_s": median,
        "ratio": median["sidecar"] / median["inloop"],
    }


def markdown(result: JSONDict) -> str:
    rows: list[list[Any]] = [
        [r["variant"], r["steps"], harness.fmt(r["loop_s"]), harness.fmt(r["steps_per_s"])]
        for r in result["runs"]
    ]
    table = harness.markdown_table(["variant", "steps", "loop s", "steps/s"], rows)
    med = result["median_steps_per_s"]
    return (
        f"{table}\n\nMedian steps/s: in-loop {med['inloop']:.3f}, sidecar "
        f"{med['sidecar']:.3f}; ratio sidecar / in-loop **{result['ratio']:.2f}** "
        f"({result['evaluations']} evaluations of the whole evaluation set in "
        f"{result['steps']} steps, global batch {result['global_batch']}).\n"
    )


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=60, help="training steps per run")
    parser.add_argument("--rounds", type=int, default=2, help="in-loop/sidecar pairs")


BENCHMARK = protocol.declare(__name__, Benchmark(
    "evaluator", "Sidecar evaluator: the workers' steps/s", run, markdown,
    description=__doc__, arguments=arguments,
))  # fmt: skip
