"""Scaling efficiency of the bundled models on CPU workers over loopback.

For MNIST and CIFAR ResNet-20 (synthetic data), with the same per-replica batch, run
1 worker, then 2 workers (4 when the machine has 4 cores), each worker a separate
process pinned to its own core and given the Slurm variables of an N-task step; the
slurmtf resolver turns them into the cluster (MultiWorkerMirroredStrategy, RING). The
examples/s come from the chief's progress lines (``step i/n ... R examples/s``), leaving
out the first interval (tracing, first all-reduce). Efficiency = rate(N) / (N * rate(1)).
All counts are measured in one run, alternating, ``repeats`` times; medians are reported.

    python -m benchmarks.bench_scaling [--quick]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import harness, protocol
from benchmarks.harness import JSONDict
from benchmarks.protocol import Benchmark, Options, figure
from slurmtf.cluster.ports import free_port_base
from slurmtf.events import parse_events

DONE = '"event": "done"'  # every rank prints this JSON event line when training ends


@dataclass(frozen=True)
class Model:
    name: str
    module: str
    flags: tuple[str, ...]
    per_replica_batch: int
    params: int  # trainable parameters: fp32 gradient bytes = 4 * params
    steps: int = 40  # full run; the first of the steps // log_every intervals is dropped
    log_every: int = 10


MNIST_PARAMS = 3_274_634
RESNET20_PARAMS = 272_474
SYNC_BN = ("--resnet_size=20", "--sync_batch_norm")
PER_BN = ("--resnet_size=20",)  # the default: per-replica batch norm
# Each model at the batch of its tables in MODELS.md, then at a larger per-worker batch:
# the all-reduce costs the same per step, so a longer step hides it (weak scaling).
MODELS = (
    Model("MNIST CNN", "models.mnist", (), 100, MNIST_PARAMS, 200, 40),
    Model("MNIST CNN", "models.mnist", (), 1000, MNIST_PARAMS, 40, 10),
    # The default normalises per replica; --sync_batch_norm adds one small all-reduce
    # per BN layer, forward and backward, and shows its cost.
    Model("CIFAR ResNet-20, synchronised BN", "models.resnet", SYNC_BN, 128, RESNET20_PARAMS),
    Model("CIFAR ResNet-20", "models.resnet", PER_BN, 128, RESNET20_PARAMS),
    Model("CIFAR ResNet-20", "models.resnet", PER_BN, 512, RESNET20_PARAMS, 24, 6),
)  # fmt: skip


def worker_counts(n_cores: int) -> list[int]:
    """1, 2, 4, ... workers, as many as there are cores to give each its own."""
    counts = [1]
    while counts[-1] * 2 <= n_cores:
        counts.append(counts[-1] * 2)
    return counts


def run_model(
    model: Model, n: int, *, steps: int, log_every: int, cpus: list[int], log_dir: Path | None
) -> JSONDict:
    global_batch = model.per_replica_batch * n
    argv = [
        harness.python(),
        "-m",
        model.module,
        *model.flags,
        "--use_synthetic_data",
        f"--batch_size={global_batch}",
        f"--train_steps={steps}",
        f"--log_every={log_every}",
        "--epochs_between_evals=100000",
        "--eval_steps=1",
    ]
    port_base = free_port_base(n)
    job_id = 800000 + port_base % 1000
    envs = [
        harness.clean_env(harness.fake_slurm_env(rank, n, job_id, port_base)) for rank in range(n)
    ]
    runs = harness.run_workers(
        [argv] * n,
        envs,
        [[cpus[rank % len(cpus)]] for rank in range(n)],
        timeout=1200,
        log_dir=None if log_dir is None else log_dir / f"{model.module}-{n}w",
        done_marker=DONE,
    )
    harness.check_runs(runs, f"{model.name} with {n} workers")
    cluster = next(e for e in parse_events(runs[0].stdout) if e["event"] == "cluster")
    rate, timed = harness.steady_rate(runs[0].stdout, global_batch)
    return {
        "workers": n,
        "global_batch": global_batch,
        "examples_per_s": rate,
        "steps_timed": timed,
        "strategy": cluster.get("strategy"),
        "cluster_workers": cluster.get("workers"),
        "wall_s": runs[0].seconds,
        "exit_codes": [r.returncode for r in runs],  # -9: killed after "done" (slow exit)
    }


def run(options: Options) -> JSONDict:
    quick, log_dir = options.quick, options.log_dir
    cpus = harness.cores()
    counts = worker_counts(len(cpus))
    repeats = 1 if quick else 2
    models: list[JSONDict] = []
    for model in MODELS:
        steps, every = (model.steps, model.log_every)
        if quick:
            steps, every = max(steps // 5, 12), max(every // 5, 4)
        samples: dict[int, list[JSONDict]] = {n: [] for n in counts}
        for _ in range(repeats):
            for n in counts:
                samples[n].append(
                    run_model(model, n, steps=steps, log_every=every, cpus=cpus, log_dir=log_dir)
                )
        rates = {n: harness.median([s["examples_per_s"] for s in samples[n]]) for n in counts}
        eff = harness.efficiency(rates)
        models.append(
            {
                "model": model.name,
                "per_replica_batch": model.per_replica_batch,
                "grad_bytes": 4 * model.params,
                "rates": {str(n): rates[n] for n in counts},
                "efficiency": {str(n): eff[n] for n in counts},
                "samples": {str(n): samples[n] for n in counts},
            }
        )
    note = None
    if len(cpus) < 4:
        note = (
            f"{len(cpus)} cores: 4 workers would share cores, so only "
            f"{', '.join(map(str, counts))} worker(s) were measured"
        )
    return {
        "name": "scaling",
        "cores": cpus,
        "worker_counts": counts,
        "repeats": repeats,
        "note": note,
        "models": models,
    }


def rows(result: JSONDict) -> list[list[Any]]:
    out = []
    for m in result["models"]:
        for n in result["worker_counts"]:
            key = str(n)
            rate = m["rates"][key]
            out.append(
                [
                    m["model"],
                    n,
                    m["per_replica_batch"],
                    rate,
                    rate / n,
                    f"{m['efficiency'][key]:.3f}",
                ]
            )
    return out


HEADERS = (
    "model",
    "workers",
    "batch per worker",
    "examples/s (all)",
    "examples/s per worker",
    "efficiency",
)


def markdown(result: JSONDict) -> str:
    text = harness.markdown_table(HEADERS, rows(result))
    if result.get("note"):
        text += f"\n{result['note']}.\n"
    return text


def plot(result: JSONDict, out_dir: Path) -> list[Path]:
    counts = result["worker_counts"]
    path = out_dir / "scaling.png"
    with figure(path) as ax:
        width = 0.8 / max(len(result["models"]), 1)
        for i, m in enumerate(result["models"]):
            xs = [j + i * width for j in range(len(counts))]
            effs = [m["efficiency"][str(n)] for n in counts]
            bars = ax.bar(xs, effs, width, label=f"{m['model']}, batch {m['per_replica_batch']}")
            ax.bar_label(bars, labels=[f"{e:.2f}" for e in effs], fontsize=8)
        ax.axhline(0.95, color="gray", ls="--", lw=1, label="target 0.95")
        ax.set_xticks([j + width * (len(result["models"]) - 1) / 2 for j in range(len(counts))])
        ax.set_xticklabels([f"{n} worker{'s' if n > 1 else ''}" for n in counts])
        ax.set_ylabel("efficiency = rate(N) / (N x rate(1))")
        ax.set_ylim(0, 1.15)
        ax.set_title("Scaling efficiency, CPU workers pinned to cores, loopback RING")
        ax.legend(fontsize=8)
    return [path]


BENCHMARK = protocol.declare(__name__, Benchmark(
    "scaling", "Scaling efficiency (CPU, loopback)", run, markdown, plot,
    description=__doc__,
))  # fmt: skip
