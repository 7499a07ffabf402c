"""Where a training step's time goes: compute, the gradient all-reduce, and what overlaps.

Every rank builds the model (MNIST CNN or CIFAR ResNet-20) under MultiWorkerMirroredStrategy
(RING, through the slurmtf resolver) and times, in one process, interleaved in rounds so
a burst of other load hits every phase (median of the per-call times, slowest rank):

- **compute**: forward, backward and the optimizer update with no all-reduce at all
  (every worker computing at once, as in training);
- **all-reduce**: slurmtf's gradient all-reduce alone, of tensors shaped like the
  model's gradients, with its CPU time (the process's user + system seconds: the
  collective's copies and sums run on the core that computes);
- **step**: the real training step (``slurmtf.training.steps``: input, compute,
  all-reduce, update) for each gradient-reduction setting (``--settings``).

``exposed`` = step - compute is the part of the all-reduce the step did not hide;
efficiency = 1-worker compute / N-worker step. Over loopback the workers are local
processes pinned to a core each (as bench_scaling); with ``--links`` they are ``srun``
tasks on a sandbox whose nodes sit behind shaped links (as bench_links).

    python -m benchmarks.bench_breakdown [--quick] [--model mnist|resnet20]
        [--links RATES|none] [--nodes 2,4] [--no-loopback] [--out DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import harness, protocol
from benchmarks.harness import JSONDict
from benchmarks.protocol import Benchmark, Options, figure
from slurmtf.cluster.ports import free_port_base
from slurmtf.errors import SlurmtfError
from slurmtf.events import emit, parse_events
from slurmtf.training.grad_reduce import GradReduce

DONE = '"event": "breakdown"'
# (label, --allreduce_dtype, --bytes_per_pack); fp32 with 0 is Keras's own all-reduce
Setting = tuple[str, str, int]
# (model, per-worker batch, settings): packs of about a third of each model's gradient
MODELS = (
    ("mnist", 100, "fp32:0,fp32:4M,bf16:0,bf16:4M"),
    ("resnet20", 128, "fp32:0,fp32:256K,bf16:0,bf16:256K"),
)
NAMES = tuple(name for name, _, _ in MODELS)
RATES = ("unshaped", "10gbit", "2.5gbit", "1gbit")


def _model(name: str) -> tuple[Any, tuple[int, ...]]:
    """(build function, input shape) of a bundled model: ``mnist`` or ``resnet20``."""
    if name == "mnist":
        from models import mnist

        return mnist.build_model, mnist.INPUT_SHAPE
    from models import resnet

    return (lambda: resnet.cifar_resnet(20)), (32, 32, 3)


def worker(
    model_name: str, batch: int, steps: int, rounds: int, settings: Sequence[Setting]
) -> int:
    """One rank: time compute, all-reduce and full steps; print one JSON event."""
    import keras
    import tensorflow as tf

    from slurmtf.training import grad_reduce
    from slurmtf.training.steps import Steps

    build_model, INPUT_SHAPE = _model(model_name)
    strategy, info = harness.ring_strategy()
    replicas = strategy.num_replicas_in_sync
    images = tf.random.uniform((batch, *INPUT_SHAPE))
    labels = tf.random.uniform((batch,), maxval=10, dtype=tf.int32)
    data = tf.data.Dataset.from_tensors((images, labels)).repeat()
    flag = tf.constant(0.0)

    def built(spec: GradReduce) -> tuple[Any, Any]:
        with strategy.scope():
            model = build_model()
            model(tf.zeros((1, *INPUT_SHAPE)), training=False)
            optimizer = keras.optimizers.Adam(1e-4)
            optimizer.build(model.trainable_variables)
        grad_reduce.take_over_reduction(optimizer, spec)
        return model, optimizer

    model, optimizer = built(GradReduce("fp32", 1))  # explicit: Keras sums nothing

    def compute_replica() -> Any:
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            )
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    def local(fn: Any) -> Any:
        """A tf.function running ``fn`` on every replica; calling it waits for the result."""
        step = tf.function(lambda: strategy.run(fn))

        def call() -> Any:
            return strategy.experimental_local_results(step())[0].numpy()

        return call

    phases: dict[tuple[str, str], Any] = {("compute", ""): local(compute_replica)}
    fake = [tf.ones(v.shape) for v in model.trainable_variables]
    for label, dtype, pack in settings:
        spec = GradReduce(dtype, pack)

        def reduce_replica(spec: GradReduce = spec) -> Any:
            return grad_reduce.all_reduce([tf.identity(g) for g in fake], spec)[0]

        phases["all-reduce", label] = local(reduce_replica)
        train = Steps(strategy, *built(spec), batch * replicas, False, reduce=spec)
        iterator = iter(
            strategy.experimental_distribute_dataset(data.unbatch().batch(batch * replicas))
        )
        phases["step", label] = lambda t=train, it=iterator: t.train_step(it, flag).numpy()
    barrier = local(lambda: tf.distribute.get_replica_context().all_reduce("sum", tf.ones([1])))
    rows = _time_phases(phases, barrier, rounds, steps)
    emit("breakdown", **info, batch=batch, rows=rows)
    return 0


def _time_phases(
    phases: dict[tuple[str, str], Any], barrier: Any, rounds: int, steps: int
) -> list[dict[str, Any]]:
    """Median wall time and mean CPU time of each phase, in interleaved rounds."""
    for fn in phases.values():  # trace and warm up
        fn()
        fn()
    times: dict[tuple[str, str], list[float]] = {key: [] for key in phases}
    cpu: dict[tuple[str, str], float] = dict.fromkeys(phases, 0.0)
    for _ in range(rounds):  # interleaved, so a burst of other load hits every phase
        for key, fn in phases.items():
            barrier()
            cpu_start = time.process_time()
            for _ in range(steps):
                start = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - start)
            cpu[key] += time.process_time() - cpu_start
    return [
        {"phase": phase, "setting": label, "seconds": harness.median(times[phase, label]),
         "cpu_seconds": cpu[phase, label] / len(times[phase, label])}
        for phase, label in phases
    ]  # fmt: skip


def parse_settings(text: str) -> list[Setting]:
    """``fp32:0,bf16:4M`` -> [(label, dtype, bytes_per_pack)]; K and M are KiB and MiB."""
    out = []
    for item in filter(None, (w.strip() for w in text.split(","))):
        dtype, _, size = item.partition(":")
        scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
        try:
            pack = int(size.rstrip("KM") or 0) * scale
            GradReduce(dtype, pack)
        except (ValueError, SlurmtfError) as exc:
            raise ValueError(
                f"--settings={text!r}: bad item {item!r} ({exc}). HINT: DTYPE:BYTES, e.g. bf16:4M"
            ) from exc
        out.append((label(dtype, pack), dtype, pack))
    return out


def label(dtype: str, pack: int) -> str:
    if not pack:
        return "fp32, Keras (one pack)" if dtype == "fp32" else f"{dtype}, one pack"
    return f"{dtype}, {harness.fmt(pack / (1 << 20))} MB packs"


@dataclass(frozen=True)
class Plan:
    """What every worker of one run measures."""

    model: str  # mnist | resnet20
    settings: str  # DTYPE:BYTES_PER_PACK,... (parse_settings)
    steps: int  # timed calls per phase and round
    rounds: int  # interleaved rounds

    @property
    def batch(self) -> int:
        return next(batch for name, batch, _ in MODELS if name == self.model)

    def argv(self) -> list[str]:
        return [harness.python(), "-m", "benchmarks.bench_breakdown", "--worker",
                f"--model={self.model}", f"--settings={self.settings}",
                f"--steps={self.steps}", f"--rounds={self.rounds}"]  # fmt: skip


def _events(stdout: str, ranks: int, what: str) -> list[JSONDict]:
    found = [e for e in parse_events(stdout) if e.get("event") == "breakdown"]
    if len(found) != ranks:
        raise RuntimeError(f"{what}: {len(found)} of {ranks} ranks reported")
    return found


def _slowest(per_rank: list[JSONDict]) -> list[JSONDict]:
    """Rank 0's rows, each time the slowest rank's (a synchronous step waits for it)."""
    rows = []
    for i, row in enumerate(per_rank[0]["rows"]):
        worst = max(per_rank, key=lambda e: e["rows"][i]["seconds"])["rows"][i]
        rows.append({**row, "seconds": worst["seconds"], "cpu_seconds": worst["cpu_seconds"]})
    return rows


def launch_local(n: int, argv: list[str], log_dir: Path | None) -> JSONDict:
    """``n`` workers on this machine, each pinned to its own core (as bench_scaling)."""
    port_base = free_port_base(n)
    envs = [
        harness.clean_env(harness.fake_slurm_env(rank, n, 810000 + port_base % 1000, port_base))
        for rank in range(n)
    ]
    cpus = harness.cores()
    runs = harness.run_workers(
        [argv] * n, envs, [[cpus[rank % len(cpus)]] for rank in range(n)], timeout=900,
        log_dir=None if log_dir is None else log_dir / f"breakdown-{n}w", done_marker=DONE,
    )  # fmt: skip
    harness.check_runs(runs, f"breakdown, {n} worker(s)")
    stdout = "".join(run_.stdout for run_ in runs)
    return {"workers": n, "rows": _slowest(_events(stdout, n, f"{n} local worker(s)"))}


def launch_srun(sandbox: Any, n: int, argv: list[str]) -> JSONDict:
    """``n`` workers as one ``srun -N n`` step on the sandbox (one per node, over its links).

    Each task writes its own output file: srun relays several tasks' stdout through one
    pipe, where long lines of different ranks can interleave and be lost.
    """
    threads = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
    env = sandbox.env(harness.clean_env(threads))
    with tempfile.TemporaryDirectory(prefix="slurmtf-breakdown-out-") as out:
        done = subprocess.run(
            ["srun", f"-N{n}", "--ntasks-per-node=1", f"--output={out}/rank%t.out", *argv],
            env=env, cwd=harness.REPO, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        stdout = "".join(path.read_text() for path in sorted(Path(out).glob("rank*.out")))
    if done.returncode != 0:
        raise RuntimeError(f"srun -N{n} failed ({done.returncode}): {done.stderr[-3000:]}")
    return {"workers": n, "rows": _slowest(_events(stdout, n, f"srun -N{n}"))}


def run_local(plan: Plan, log_dir: Path | None) -> JSONDict:
    """1 worker (compute only), then 2 workers, pinned to a core each, over loopback."""
    one = launch_local(1, [*plan.argv(), "--compute_only"], log_dir)
    two = launch_local(2, plan.argv(), log_dir)
    return {"link": "loopback", "one_worker": one, "runs": [two]}


def run_links(plan: Plan, rates: Sequence[str], nodes: Sequence[int]) -> list[JSONDict]:
    """A sandbox with links: per rate, one run per worker count; 1 worker once, unshaped."""
    from slurmtf.sandbox import Sandbox, links

    out = []
    with tempfile.TemporaryDirectory(prefix="slurmtf-breakdown-") as tmp:
        sandbox = Sandbox(Path(tmp), nodes=max(nodes), gpus_per_node=0, link="unshaped")
        sandbox.up()
        try:
            link_plan = sandbox.config().link_plan
            if link_plan is None:
                raise RuntimeError("the sandbox has no links")
            one = launch_srun(sandbox, 1, [*plan.argv(), "--compute_only"])
            for rate in rates:
                links.reshape(link_plan, links.parse_rate(rate))
                runs = [_attempt(launch_srun, sandbox, n, plan.argv()) for n in nodes]
                out.append({"link": rate, "one_worker": one, "runs": runs})
        finally:
            sandbox.down()
    return out


def _attempt(launch: Any, sandbox: Any, n: int, argv: list[str]) -> JSONDict:
    """One launch; a failure is recorded in its place so the other runs still count."""
    try:
        result: JSONDict = launch(sandbox, n, argv)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return {"workers": n, "error": f"{type(exc).__name__}: {str(exc)[-500:]}"}
    return result


def run(options: Options) -> JSONDict:
    """Each model pinned over loopback, then (``--links``) over the sandbox's links."""
    quick = options.quick
    steps = options.flag("steps", None) or (3 if quick else 10)
    rounds = options.flag("rounds", None) or (2 if quick else 4)
    rates_text = options.flag("links", None)
    if rates_text is None:
        rates_text = "" if quick else ",".join(RATES)
    rates = [r for r in rates_text.split(",") if r and r != "none"]
    names = [options.flag("model", None)] if options.flag("model", None) else NAMES
    models = []
    for name in names:
        default = next(settings for model, _, settings in MODELS if model == name)
        plan = Plan(name, options.flag("settings", None) or default, steps, rounds)
        measured = [run_local(plan, options.log_dir)] if options.flag("loopback", True) else []
        if rates:
            nodes = [int(n) for n in options.flag("nodes", "2,4").split(",")]
            measured += run_links(plan, rates, nodes if name == "mnist" else [2])
        models.append({"model": name, "batch": plan.batch, "links": measured})
    return {"name": "breakdown", "steps": steps, "rounds": rounds, "models": models}


def rows(result: JSONDict) -> list[list[Any]]:
    """One row per model, link, worker count and setting."""
    out = []
    for entry in result["models"]:
        for link in entry["links"]:
            t1 = link["one_worker"]["rows"][0]["seconds"]
            for run_ in link["runs"]:
                if "error" in run_:
                    continue
                by = {(r["phase"], r["setting"]): r for r in run_["rows"]}
                compute = by["compute", ""]["seconds"]
                for (phase, setting), r in by.items():
                    if phase != "step":
                        continue
                    red = by["all-reduce", setting]
                    out.append([entry["model"], link["link"], run_["workers"], setting,
                                1e3 * t1, 1e3 * compute, 1e3 * red["seconds"],
                                1e3 * red["cpu_seconds"], 1e3 * r["seconds"],
                                1e3 * (r["seconds"] - compute), compute / r["seconds"],
                                t1 / r["seconds"]])  # fmt: skip
    return out


HEADERS = ("model", "link", "workers", "gradient all-reduce", "1 worker compute (ms)",
           "compute, all workers at once (ms)", "all-reduce alone (ms)",
           "all-reduce CPU (ms)", "step (ms)", "exposed = step - compute (ms)",
           "compute / step", "efficiency = 1-worker compute / step")  # fmt: skip


def markdown(result: JSONDict) -> str:
    return harness.markdown_table(HEADERS, rows(result))


def plot(result: JSONDict, out_dir: Path) -> list[Path]:
    """Per model: step time split into compute and exposed all-reduce, per link and setting."""
    paths = []
    for entry in result["models"]:
        table = [r for r in rows(result) if r[0] == entry["model"]]
        names = [f"{r[1]}, {r[2]}w, {r[3]}" for r in table]
        path = out_dir / f"breakdown_{entry['model']}.png"
        with figure(path, size=(7.0, 1.2 + 0.22 * len(table))) as ax:
            ax.barh(names, [r[5] for r in table], color="C0", label="compute, all workers at once")
            ax.barh(names, [max(r[9], 0.0) for r in table], left=[r[5] for r in table],
                    color="C3", label="exposed all-reduce (step - compute)")  # fmt: skip
            ax.axvline(table[0][4], color="k", ls="--", lw=1, label="1 worker compute")
            ax.invert_yaxis()
            ax.tick_params(axis="y", labelsize=6)
            ax.set_xlabel(f"ms per step ({entry['model']}, batch {entry['batch']} per worker)")
            ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3)
        paths.append(path)
    return paths


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=NAMES, help="one model (default: both)")
    parser.add_argument(
        "--links", help=f"link rates to run over, or none (default {','.join(RATES)})"
    )
    parser.add_argument(
        "--loopback",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run pinned to cores over loopback",
    )
    parser.add_argument("--nodes", default="2,4", help="MNIST worker counts over the links")
    parser.add_argument("--settings", help="DTYPE:BYTES_PER_PACK,... to compare")
    parser.add_argument("--steps", type=int, help="timed steps per phase and round")
    parser.add_argument("--rounds", type=int, help="interleaved rounds")
    parser.add_argument("--compute_only", action="store_true", help=argparse.SUPPRESS)


def _worker(args: argparse.Namespace) -> int:
    plan = Plan(args.model or "mnist", args.settings or "", args.steps or 10, args.rounds or 4)
    chosen = [] if args.compute_only else parse_settings(plan.settings)
    return worker(plan.model, plan.batch, plan.steps, plan.rounds, chosen)


BENCHMARK = protocol.declare(__name__, Benchmark(
    "breakdown", "Where the step time goes: compute vs all-reduce", run, markdown, plot,
    description=__doc__, arguments=_arguments, worker=_worker,
))  # fmt: skip
