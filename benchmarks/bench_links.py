"""All-reduce over real, shaped links: bus bandwidth per link rate, with and without compression.

A sandbox of N nodes (``--nodes``, default 2) with links (``Sandbox(link=...)``: each
node its own network namespace, a veth to a bridge, ``tc tbf`` both ways). For each rate
the caps are changed in place, one Python TCP stream node1 -> node2 measures what the
link carries, and one ``srun -NN`` step runs a TensorFlow worker per node that times
``slurmtf``'s own gradient all-reduce (:func:`slurmtf.training.grad_reduce.all_reduce`)
for each wire dtype. Bus
bandwidth counts the fp32 bytes the caller asked to reduce (so compression shows as
more bandwidth): size / time * 2(n-1)/n, as nccl-tests defines it.

    python -m benchmarks.bench_links [--quick] [--rates unshaped,10gbit,2.5gbit,1gbit]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness, protocol
from benchmarks.harness import JSONDict
from benchmarks.protocol import Benchmark, Options, figure
from slurmtf.events import emit, parse_events

RATES = ("unshaped", "10gbit", "2.5gbit", "1gbit")
DTYPES = ("fp32", "bf16", "fp16")


def worker(sizes: Sequence[int], iters: int, dtypes: Sequence[str]) -> int:
    """One rank under srun: time the gradient all-reduce of each size and dtype."""
    import tensorflow as tf

    from slurmtf.training.grad_reduce import GradReduce, all_reduce

    strategy, info = harness.ring_strategy()

    def make_step(spec: GradReduce) -> Any:
        def replica_fn(v: Any) -> Any:
            return all_reduce([tf.identity(v)], spec)[0][0]

        return tf.function(lambda x: strategy.run(replica_fn, args=(x,)))

    def call(step: Any, x: Any) -> float:
        return float(strategy.experimental_local_results(step(x))[0].numpy())

    barrier, one = make_step(GradReduce()), tf.ones([1], tf.float32)
    rows = []
    for dtype in dtypes:
        for size in sizes:
            x = tf.ones([size // 4], tf.float32)
            step = make_step(GradReduce(dtype))
            call(step, x)  # trace and warm up
            call(barrier, one)
            times = []
            for _ in range(iters):
                start = time.perf_counter()
                value = call(step, x)
                times.append(time.perf_counter() - start)
            if value != len(info["workers"]):
                raise RuntimeError(f"{dtype} all-reduce of ones gave {value}")
            rows.append({"dtype": dtype, "bytes": size, "seconds": harness.median(times)})
    emit("links_allreduce", **info, results=rows)
    return 0


def _measure_rate(sandbox: Any, plan: Any, rate: str, argv: list[str], nodes: int) -> JSONDict:
    import subprocess

    from slurmtf.sandbox import links

    links.reshape(plan, links.parse_rate(rate))
    tcp = links.measure_tcp(plan.node_ns(1), plan.node_ns(2), plan.node_addr(2), seconds=2.0)
    env = sandbox.env(harness.clean_env({"TF_NUM_INTRAOP_THREADS": "1",
                                         "TF_NUM_INTEROP_THREADS": "1"}))  # fmt: skip
    done = subprocess.run(
        ["srun", f"-N{nodes}", "--ntasks-per-node=1", *argv],
        env=env, cwd=harness.REPO, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    per_rank = [e for e in parse_events(done.stdout) if e["event"] == "links_allreduce"]
    if done.returncode != 0 or len(per_rank) != nodes:
        raise RuntimeError(f"srun at {rate} failed ({done.returncode}): {done.stderr[-3000:]}")
    rows = []
    for i, row in enumerate(per_rank[0]["results"]):
        seconds = max(rank["results"][i]["seconds"] for rank in per_rank)
        busbw = harness.bus_bandwidth(row["bytes"], seconds, nodes)
        rows.append({**row, "seconds": seconds, "busbw_bytes_per_s": busbw})
    return {"rate": rate, "workers": nodes, "tcp_bits_per_s": tcp, "results": rows}


def run(options: Options) -> JSONDict:
    """The sandbox with links, every rate in turn; ``--rates``, ``--dtypes``, ``--nodes``."""
    from slurmtf.sandbox import Sandbox

    quick = options.quick
    rates = options.flag("rates", ",".join(RATES)).split(",")
    dtypes = options.flag("dtypes", ",".join(DTYPES)).split(",")
    nodes = options.flag("nodes", 2)
    sizes = [mb * harness.MB for mb in ((4, 16) if quick else (4, 16, 64))]
    iters = 3 if quick else 5
    argv = [harness.python(), "-m", "benchmarks.bench_links", "--worker", "--iters", str(iters),
            "--sizes", ",".join(map(str, sizes)), "--dtypes", ",".join(dtypes)]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="slurmtf-links-") as tmp:
        sandbox = Sandbox(Path(tmp), nodes=nodes, gpus_per_node=0, link="unshaped")
        sandbox.up()
        try:
            plan = sandbox.config().link_plan
            measured = [_measure_rate(sandbox, plan, rate, argv, nodes) for rate in rates]
        finally:
            sandbox.down()
    return {"name": "links", "quick": quick, "iterations": iters, "rates": measured}


def rows(result: JSONDict) -> list[list[Any]]:
    from slurmtf.sandbox.links import parse_rate

    out = []
    for entry in result["rates"]:
        cap = parse_rate(entry["rate"]) / 8  # bytes/s each way; 0 = no cap
        for row in entry["results"]:
            busbw = row["busbw_bytes_per_s"]
            out.append([entry["rate"], entry["tcp_bits_per_s"] / 1e9, row["dtype"],
                        row["bytes"] // harness.MB, row["seconds"] * 1e3, busbw / 1e9,
                        busbw / cap if cap else None])  # fmt: skip
    return out


HEADERS = ("link", "TCP stream (Gbit/s)", "wire dtype", "size (MB fp32)",
           "all-reduce time (ms)", "busbw (GB/s, fp32 bytes)", "busbw / link rate")  # fmt: skip


def markdown(result: JSONDict) -> str:
    return harness.markdown_table(HEADERS, rows(result))


def plot(result: JSONDict, out_dir: Path) -> list[Path]:
    table = [r for r in rows(result) if r[3] == max(r[3] for r in rows(result))]
    rates = list(dict.fromkeys(r[0] for r in table))
    caps = [float(x.removesuffix("gbit")) / 8 if x.endswith("gbit") else math.nan for x in rates]
    workers = result["rates"][0].get("workers", 2)
    path = out_dir / f"links_allreduce_{workers}w.png"
    with figure(path) as ax:
        for dtype in dict.fromkeys(r[2] for r in table):
            busbw = [next(r[5] for r in table if r[0] == x and r[2] == dtype) for x in rates]
            ax.plot(rates, busbw, "o-", label=f"all-reduce busbw, {dtype} on the wire")
        ax.plot(rates, caps, "k--", label="link rate (GB/s)")
        ax.set_xlabel("link (each way, tc tbf)")
        ax.set_ylabel("GB/s (fp32 bytes reduced)")
        ax.set_title(f"{workers}-worker all-reduce of {table[0][3]} MB over shaped links (CPU)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return [path]


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rates", default=",".join(RATES), help="comma-separated link rates")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="wire dtypes to compare")
    parser.add_argument("--nodes", type=int, default=2, help="workers, one per node (default 2)")
    parser.add_argument("--sizes", default="", help=argparse.SUPPRESS)
    parser.add_argument("--iters", type=int, default=3, help=argparse.SUPPRESS)


def _worker(args: argparse.Namespace) -> int:
    return worker([int(s) for s in args.sizes.split(",")], args.iters, args.dtypes.split(","))


BENCHMARK = protocol.declare(__name__, Benchmark(
    "links", "All-reduce over shaped links", run, markdown, plot,
    description=__doc__, arguments=_arguments, worker=_worker,
))  # fmt: skip
