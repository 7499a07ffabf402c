"""One rank of the check step (``python -m slurmtf.check.probe``; ``slurmtf check`` starts
one per node with ``srun``): link rates over plain TCP, then TensorFlow: the all-reduce
bus bandwidth of MultiWorkerMirroredStrategy (RING on CPU, NCCL on GPUs, as the models
use it) and a fixed matmul on each of this rank's devices. Rank 0 prints one ``check``
event with every rank's figures and the verdict.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from slurmtf.check import verdict
from slurmtf.check.mesh import Mesh, link_rates
from slurmtf.events import emit
from slurmtf.tf.lean_import import import_tensorflow_lean

MATMUL_N = 512
MB = 1 << 20
# The link rounds of a large allocation share this much time (at most LINK_ROUND_S each,
# at least LINK_ROUND_MIN_S): 15 rounds of 0.5 s were 8.4 s of a 16-node check.
LINK_BUDGET_S, LINK_ROUND_S, LINK_ROUND_MIN_S = 5.0, 0.5, 0.25
# The compute turns of the ranks that share a host share this much time (a window of at
# most COMPUTE_WINDOW_S each, at least COMPUTE_WINDOW_MIN_S).
COMPUTE_BUDGET_S, COMPUTE_WINDOW_S, COMPUTE_WINDOW_MIN_S = 2.0, 0.5, 0.1


def plan_devices(gpus: Sequence[str]) -> tuple[list[str], str]:
    """The devices whose compute is measured, and the collective implementation."""
    if gpus:
        return [f"/GPU:{i}" for i in range(len(gpus))], "NCCL"
    return ["/CPU:0"], "RING"


def host_turns(hosts: Sequence[str], rank: int) -> tuple[int, int]:
    """(this rank's turn, number of turns): ranks that share a host measure compute one
    after the other (a sandbox's nodes all share one machine's cores)."""
    turn = sum(1 for h in hosts[:rank] if h == hosts[rank])
    return turn, max(hosts.count(h) for h in hosts)


def round_seconds(rounds: int) -> float:
    """Seconds per link round when ``--link_seconds`` is not given."""
    return min(LINK_ROUND_S, max(LINK_ROUND_MIN_S, LINK_BUDGET_S / max(rounds, 1)))


def compute_window(turns: int) -> float:
    """Seconds one rank measures compute in when ``turns`` ranks share its host."""
    return min(COMPUTE_WINDOW_S, max(COMPUTE_WINDOW_MIN_S, COMPUTE_BUDGET_S / max(turns, 1)))


def device_label(gpu_names: Sequence[str]) -> str:
    """``CPU`` or ``2x NVIDIA H100`` (the first GPU's name)."""
    return f"{len(gpu_names)}x {gpu_names[0]}" if gpu_names else "CPU"


def _gpu_names(tf: Any) -> list[str]:
    names = []
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        names.append(str(details.get("device_name", gpu.name)))
    return names


def _strategy(tf: Any, implementation: str) -> Any:
    from slurmtf.resolver import cluster_resolver

    # keras_fit=False: the probe builds no model, and Keras would cost every rank its
    # import here (15 s of a 16-node check on the sandbox) after import_tensorflow_lean.
    comm = tf.distribute.experimental.CommunicationImplementation[implementation]
    options = tf.distribute.experimental.CommunicationOptions(implementation=comm)
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=cluster_resolver(keras_fit=False), communication_options=options
    )


def allreduce_seconds(tf: Any, strategy: Any, nbytes: int, iters: int) -> float:
    """This rank's median time of ``all_reduce(SUM)`` of ``nbytes`` of float32 over
    ``iters`` calls, each waited for (after one warm-up): ``bench_links``' method."""

    def replica_fn(v: Any) -> Any:
        v = tf.identity(v)
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, v)[0]

    step = tf.function(lambda x: strategy.run(replica_fn, args=(x,)))
    x = tf.ones([nbytes // 4], tf.float32)
    float(strategy.experimental_local_results(step(x))[0].numpy())  # warm up, and sync
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        float(strategy.experimental_local_results(step(x))[0].numpy())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bus_gbps(nbytes: int, seconds: float, replicas: int) -> float:
    """Bus bandwidth (Gbit/s) as nccl-tests defines it: size / time x 2(n-1)/n."""
    return nbytes / seconds * (2 * (replicas - 1) / replicas if replicas > 1 else 1.0) * 8 / 1e9


def compute_gflops(tf: Any, device: str, seconds: float) -> float:
    """GFLOP/s of a fixed float32 matmul on ``device``: the best of short windows over
    about ``seconds`` (the best, so that a neighbour's burst does not count)."""
    with tf.device(device):
        a = tf.random.stateless_uniform([MATMUL_N, MATMUL_N], seed=[1, 2])
        step = tf.function(lambda m: tf.linalg.matmul(m, a) * 0.5)
        float(tf.reduce_sum(step(a)).numpy())
        best, end = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            start, m = time.perf_counter(), a
            for _ in range(4):
                m = step(m)
            float(tf.reduce_sum(m).numpy())
            best = max(best, 4 / (time.perf_counter() - start))
    return 2 * MATMUL_N**3 * best / 1e9


def run(args: argparse.Namespace) -> int:
    from slurmtf.resolver import resolve

    t0 = time.monotonic()
    phases: dict[str, float] = {}
    layout = resolve()
    n, rank = layout.num_workers, layout.task_index
    mesh = Mesh(rank, layout.workers, timeout=args.timeout)
    try:
        rounds = min(args.link_rounds, n - 1)
        seconds = args.link_seconds or round_seconds(rounds)
        rates = link_rates(mesh, rounds, seconds) if n > 1 else {}
        phases["links"] = time.monotonic() - t0
        tf = import_tensorflow_lean()
        gpus = _gpu_names(tf)
        gathered = mesh.allgather([gpus, socket.gethostname()])
        phases["import"] = time.monotonic() - t0
    finally:
        mesh.close()
    devices, implementation = plan_devices(gpus)
    strategy = _strategy(tf, implementation)
    phases["strategy"] = time.monotonic() - t0
    gather = _Gather(tf, strategy, rank, n)
    nbytes = int(args.allreduce_mb * MB)
    slowest = max(gather(allreduce_seconds(tf, strategy, nbytes, args.iters)))
    busbw = bus_gbps(nbytes, slowest, strategy.num_replicas_in_sync)
    phases["allreduce"] = time.monotonic() - t0
    names = [g[0] for g in gathered]
    turn, turns = host_turns([g[1] for g in gathered], rank)
    window = compute_window(turns)

    def in_turns(measure: bool) -> float:
        best = 0.0
        for t in range(turns):  # ranks on one host take turns: they share its CPUs
            if t == turn and measure:
                best = min(compute_gflops(tf, d, window) for d in devices)
            gather(0.0)  # a barrier
        return best

    every = gather(in_turns(True))
    # A rank that looks slow measures again and keeps its better figure: a burst of other
    # work on its host is not a slow node; a slow node is slow twice.
    suspect = verdict.suspects(every, args.threshold)
    if suspect:
        again = gather(in_turns(rank in suspect))
        every = [max(a, b) for a, b in zip(every, again, strict=True)]
    phases["compute"] = time.monotonic() - t0
    if rank != 0:
        return 0
    figures = [
        verdict.NodeFigures(
            rank=r,
            node=layout.nodes[r],
            device=device_label(names[r]),
            gpus=tuple(names[r]),
            compute_gflops=every[r],
            allreduce_gbps=busbw,
        )
        for r in range(n)
    ]
    matrix = {str(s): {str(d): v for d, v in row.items()} for s, row in rates.items()}
    extra = {
        "seconds": time.monotonic() - t0,
        "implementation": implementation,
        "allreduce_mb": args.allreduce_mb,
        "link_seconds": seconds,
        "compute_window_s": window,
        "rates_bps": matrix,
        "phases_s": phases,
    }
    result = verdict.judge(figures, rates, args.threshold, extra)
    emit("check", **result.to_json())
    return 0


class _Gather:
    """Every rank's one float through one all-reduce of a one-hot vector (traced once;
    also the barrier between compute turns)."""

    def __init__(self, tf: Any, strategy: Any, rank: int, n: int) -> None:
        self.tf, self.rank, self.n = tf, rank, n
        self.replicas = strategy.num_replicas_in_sync // n or 1  # GPUs of a rank add up

        def replica_fn(v: Any) -> Any:
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(v))

        self.step = tf.function(lambda x: strategy.run(replica_fn, args=(x,)))
        self.local = strategy.experimental_local_results

    def __call__(self, mine: float) -> list[float]:
        flat = [0.0] * self.n
        flat[self.rank] = mine
        out = self.local(self.step(self.tf.constant(flat, self.tf.float64)))
        return [float(v) / self.replicas for v in out[0].numpy()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m slurmtf.check.probe", description=__doc__)
    p.add_argument("--threshold", type=float, default=verdict.DEFAULT_THRESHOLD)
    p.add_argument("--link_seconds", type=float, default=None, help="default: round_seconds")
    p.add_argument("--link_rounds", type=int, default=15)
    p.add_argument("--allreduce_mb", type=float, default=4.0)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--timeout", type=float, default=120.0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return run(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
