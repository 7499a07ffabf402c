"""All-reduce bus bandwidth of MultiWorkerMirroredStrategy (RING on CPU) vs raw loopback TCP.

Two worker processes on this machine, each pinned to its own core, each given the Slurm
variables of a 2-task step; the slurmtf resolver turns those into the cluster spec. For
each tensor size (1 MB to 256 MB of float32) the workers run ``all_reduce(SUM)`` inside
``strategy.run`` and time it; bus bandwidth = size / time * 2(n-1)/n (= size / time for
two workers), as nccl-tests defines it.

In the same run, two plain Python processes pinned the same way push the same sizes
through a loopback TCP socket, one way and both ways at once. A two-rank ring all-reduce
sends and receives ``size`` bytes per rank at the same time, so the two-way TCP rate is
the physical ceiling for its bus bandwidth here.

    python -m benchmarks.bench_allreduce [--quick]
"""

from __future__ import annotations

import argparse
import socket
import struct
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness, protocol
from benchmarks.harness import JSONDict
from benchmarks.protocol import Benchmark, Options, figure
from slurmtf.cluster.ports import free_port_base
from slurmtf.events import emit, parse_events

SIZES_MB = (1, 4, 16, 64, 256)
_HEADER = struct.Struct("!cQ")  # mode (b"U" one way, b"B" both ways, b"Q" quit), size


# ---------------------------------------------------------------------------- TCP
def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection")
        got += n


def _both_ways(sock: socket.socket, send: memoryview, recv: memoryview) -> None:
    sender = threading.Thread(target=sock.sendall, args=(send,))
    sender.start()
    _recv_exact(sock, recv)
    sender.join()


def tcp_server(port: int, max_bytes: int) -> int:
    """Echo side of the TCP measurement: receive (and send) what the client asks for."""
    send = memoryview(bytearray(max_bytes))
    recv = memoryview(bytearray(max_bytes))
    with socket.create_server(("127.0.0.1", port)) as server:
        print("ready", flush=True)
        conn, _ = server.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            header = memoryview(bytearray(_HEADER.size))
            while True:
                _recv_exact(conn, header)
                mode, size = _HEADER.unpack(header)
                if mode == b"Q":
                    return 0
                if mode == b"U":
                    _recv_exact(conn, recv[:size])
                else:
                    _both_ways(conn, send[:size], recv[:size])
                conn.sendall(b"k")


def tcp_client(port: int, sizes: Sequence[int], iters: int) -> int:
    """Drive the server; print one JSON line with per-size one-way and two-way rates."""
    max_bytes = max(sizes)
    send = memoryview(bytearray(max_bytes))
    recv = memoryview(bytearray(max_bytes))
    ack = memoryview(bytearray(1))
    rows = []
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for size in sizes:
            row: JSONDict = {"bytes": size}
            for mode, key in ((b"U", "one_way"), (b"B", "two_way")):
                times = []
                for i in range(iters + 1):  # the first round warms the buffers
                    start = time.perf_counter()
                    conn.sendall(_HEADER.pack(mode, size))
                    if mode == b"U":
                        conn.sendall(send[:size])
                    else:
                        _both_ways(conn, send[:size], recv[:size])
                    _recv_exact(conn, ack)
                    if i:
                        times.append(time.perf_counter() - start)
                seconds = harness.median(times)
                row[key] = {"seconds": seconds, "bytes_per_s": size / seconds}
            rows.append(row)
        conn.sendall(_HEADER.pack(b"Q", 0))
    emit("tcp", results=rows)
    return 0


def measure_tcp(sizes: Sequence[int], iters: int, cpus: Sequence[Sequence[int] | None]) -> JSONDict:
    """Run the TCP server and client as two pinned processes; return the client's rows."""
    import subprocess

    port = free_port_base(1)
    me = [harness.python(), "-m", "benchmarks.bench_allreduce", "--worker"]
    env = harness.clean_env()
    server = subprocess.Popen(
        [*me, "--tcp_server", str(port), "--sizes", ",".join(map(str, sizes))],
        env=env,
        cwd=harness.REPO,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=harness.pin_to(cpus[1]),  # noqa: PLW1509 - single-threaded parent
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise RuntimeError("TCP server did not start")
        runs = harness.run_workers(
            [
                [
                    *me,
                    "--tcp_client",
                    str(port),
                    "--sizes",
                    ",".join(map(str, sizes)),
                    "--iters",
                    str(iters),
                ]
            ],
            [env],
            [cpus[0]],
            timeout=600,
        )
        harness.check_runs(runs, "tcp client")
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    events = [e for e in parse_events(runs[0].stdout) if e["event"] == "tcp"]
    return {"results": events[0]["results"]}


# ---------------------------------------------------------------------------- all-reduce
def allreduce_worker(sizes: Sequence[int], iters: int, warmup: int) -> int:
    """One rank: time ``all_reduce(SUM)`` of a float32 tensor of each size; print JSON."""
    import tensorflow as tf

    strategy, info = harness.ring_strategy()

    def replica_fn(v: Any) -> Any:
        # identity places the input on this replica's device; a bare function argument
        # has none, and the all-reduce then fails with "destinations can not be empty".
        v = tf.identity(v)
        total = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, v)
        return total[0]

    def make_step() -> Any:
        # A fresh tf.function per size: each traces its own collective instance.
        return tf.function(lambda x: strategy.run(replica_fn, args=(x,)))

    def call(step: Any, x: Any) -> float:
        out = step(x)
        return float(strategy.experimental_local_results(out)[0].numpy())

    rows = []
    barrier = make_step()
    one = tf.ones([1], tf.float32)
    for size in sizes:
        x = tf.ones([size // 4], tf.float32)
        step = make_step()
        for _ in range(warmup):
            call(step, x)
        call(barrier, one)  # both ranks start timing together
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            value = call(step, x)
            times.append(time.perf_counter() - start)
        if value != info["workers"].__len__():
            raise RuntimeError(f"all-reduce of ones gave {value}, expected {len(info['workers'])}")
        rows.append({"bytes": size, "seconds": harness.median(times), "times": times})
    emit("allreduce", **info, results=rows)
    return 0


def measure_allreduce(
    sizes: Sequence[int],
    iters: int,
    warmup: int,
    cpus: Sequence[Sequence[int] | None],
    log_dir: Path | None,
) -> JSONDict:
    n = len(cpus)
    port_base = free_port_base(n)
    job_id = 700000 + port_base % 1000
    argv = [
        harness.python(),
        "-m",
        "benchmarks.bench_allreduce",
        "--worker",
        "--sizes",
        ",".join(map(str, sizes)),
        "--iters",
        str(iters),
        "--warmup",
        str(warmup),
    ]
    envs = [
        harness.clean_env(harness.fake_slurm_env(rank, n, job_id, port_base)) for rank in range(n)
    ]
    runs = harness.run_workers(
        [argv] * n, envs, cpus, timeout=900, log_dir=log_dir, done_marker='"event": "allreduce"'
    )
    harness.check_runs(runs, "all-reduce worker")
    per_rank = [
        next(e for e in parse_events(run.stdout) if e["event"] == "allreduce") for run in runs
    ]
    rows = []
    for i, size in enumerate(sizes):
        seconds = max(rank["results"][i]["seconds"] for rank in per_rank)
        rows.append(
            {
                "bytes": size,
                "seconds": seconds,
                "algbw_bytes_per_s": size / seconds,
                "busbw_bytes_per_s": harness.bus_bandwidth(size, seconds, n),
            }
        )
    return {"workers": n, "cluster": per_rank[0]["workers"], "results": rows}


# ---------------------------------------------------------------------------- entry
def run(options: Options) -> JSONDict:
    quick = options.quick
    sizes = [mb * harness.MB for mb in SIZES_MB]
    avail = harness.cores()
    cpus: list[Sequence[int] | None] = [[avail[0]], [avail[-1]]]
    iters = 3 if quick else 10
    tcp = measure_tcp(sizes, iters, cpus)
    allreduce = measure_allreduce(
        sizes, iters, warmup=1 if quick else 2, cpus=cpus, log_dir=options.log_dir
    )
    return {
        "name": "allreduce",
        "quick": quick,
        "pinned_cores": [list(c) if c else None for c in cpus],
        "shared_core": avail[0] == avail[-1],
        "iterations": iters,
        "tcp": tcp,
        "allreduce": allreduce,
    }


def rows(result: JSONDict) -> list[list[Any]]:
    out = []
    for ar, tcp in zip(result["allreduce"]["results"], result["tcp"]["results"], strict=True):
        busbw = ar["busbw_bytes_per_s"]
        two_way = tcp["two_way"]["bytes_per_s"]
        out.append(
            [
                ar["bytes"] // harness.MB,
                ar["seconds"] * 1e3,
                busbw / 1e9,
                tcp["one_way"]["bytes_per_s"] / 1e9,
                two_way / 1e9,
                busbw / two_way,
            ]
        )
    return out


HEADERS = (
    "size (MB)",
    "all-reduce time (ms)",
    "all-reduce busbw (GB/s)",
    "TCP one way (GB/s)",
    "TCP both ways, per direction (GB/s)",
    "busbw / TCP both ways",
)


def markdown(result: JSONDict) -> str:
    return harness.markdown_table(HEADERS, rows(result))


def plot(result: JSONDict, out_dir: Path) -> list[Path]:
    table = rows(result)
    sizes = [r[0] for r in table]
    path = out_dir / "allreduce.png"
    with figure(path) as ax:
        ax.plot(sizes, [r[2] for r in table], "o-", label="MWMS all-reduce busbw (RING, 2 workers)")
        ax.plot(sizes, [r[3] for r in table], "s--", label="loopback TCP, one way")
        ax.plot(
            sizes, [r[4] for r in table], "^--", label="loopback TCP, both ways (per direction)"
        )
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.set_xlabel("tensor size (MB)")
        ax.set_ylabel("GB/s")
        ax.set_title("All-reduce bus bandwidth vs loopback TCP (CPU)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return [path]


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tcp_server", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tcp_client", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="", help=argparse.SUPPRESS)
    parser.add_argument("--iters", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=1, help=argparse.SUPPRESS)


def _worker(args: argparse.Namespace) -> int:
    """The processes this benchmark starts: a TCP server or client, or an all-reduce rank."""
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.tcp_server is not None:
        return tcp_server(args.tcp_server, max(sizes))
    if args.tcp_client is not None:
        return tcp_client(args.tcp_client, sizes, args.iters)
    return allreduce_worker(sizes, args.iters, args.warmup)


BENCHMARK = protocol.declare(__name__, Benchmark(
    "allreduce", "All-reduce bus bandwidth vs loopback TCP", run, markdown, plot,
    description=__doc__, arguments=_arguments, worker=_worker,
))  # fmt: skip
