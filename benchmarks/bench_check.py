"""Wall time of ``slurmtf check --nodes=N`` on a sandbox whose nodes have 1gbit links.

For each size (4 and 16 nodes; ``--quick``: 4) a fresh sandbox (``--link 1gbit``, no
GPUs) is started, ``slurmtf check --nodes=N`` runs from the "login node" as a user types
it, and its wall time, the phases inside the check step (cumulative seconds after the
link rounds, the TensorFlow import, the strategy, the all-reduce and the compute turns), the median
link figures and the all-reduce bus bandwidth are kept. Every sandbox node is a process
on this one machine: they share its cores, so the TensorFlow import of N processes at
once is what grows with N here; on a cluster each node imports on its own cores.

On the same sandbox, right after the check, ``benchmarks.bench_links``' worker times
slurmtf's gradient all-reduce (fp32, the check's size, one task per node) as the
reference for the check's all-reduce figure; ``agreement`` is check / reference (the
check's target: within 20 %).

At width (``--mesh_sizes``, 16 to 1,024 ranks; no sandbox, no TensorFlow): the check's
TCP all-gather, which every link round starts with and which gathers the verdict's
figures, with every rank a thread of this process on loopback; kept are the seconds of
each of 3 all-gathers, the threads rank 0 holds at once and the connects its listening
socket dropped (``TcpExt ListenOverflows``).

    python -m benchmarks.bench_check [--quick] [--sizes 4,16] [--mesh_sizes 16,64,256,1024]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import harness, protocol
from benchmarks.harness import JSONDict
from benchmarks.protocol import Benchmark, Options
from slurmtf.check.mesh import Mesh
from slurmtf.cluster.ports import free_port_base
from slurmtf.events import parse_events
from slurmtf.sandbox import Sandbox

MESH_SIZES = (16, 64, 256, 1024)
MESH_GATHERS = 3


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="4,16", help="node counts (default 4,16)")
    parser.add_argument(
        "--mesh_sizes",
        default=",".join(map(str, MESH_SIZES)),
        help="ranks of the check's all-gather at width (default 16,...,1024)",
    )


def listen_overflows() -> int:
    """Connects this machine's listening sockets dropped so far (TcpExt ListenOverflows)."""
    lines = [x.split() for x in Path("/proc/net/netstat").read_text().splitlines()]
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names[0] == "TcpExt:" and "ListenOverflows" in names:
            return int(values[names.index("ListenOverflows")])
    return 0


def mesh_width(n: int) -> JSONDict:
    """The check's all-gather (its barrier before every link round, and the gather of the
    verdict's figures) over ``n`` ranks on loopback, every rank a thread of this process:
    what rank 0 holds at once (a thread per peer), the connects its listening socket
    dropped, and the seconds of each all-gather (all ranks share this interpreter's lock:
    an upper bound)."""
    base = free_port_base(n)
    workers = [f"127.0.0.1:{base + r}" for r in range(n)]
    meshes = [Mesh(r, workers, timeout=300) for r in range(n)]
    seconds: list[float] = []
    peak = [0]

    def rank(r: int) -> None:
        for _ in range(MESH_GATHERS):
            started = time.perf_counter()
            if len(meshes[r].allgather([r, f"node{r:05d}"])) != n:
                raise RuntimeError(f"rank {r}: an all-gather lost a rank")
            if r == 0:
                seconds.append(time.perf_counter() - started)
            peak[0] = max(peak[0], threading.active_count())

    dropped = listen_overflows()
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for mesh in meshes:
        mesh.close()
    return {"ranks": n, "allgather_s": [round(x, 2) for x in seconds],
            "peak_threads": peak[0], "listen_overflows": listen_overflows() - dropped}  # fmt: skip


def measure(nodes: int, work: Path) -> JSONDict:
    """One sandbox of ``nodes`` nodes, one ``slurmtf check --nodes=N``; its figures."""
    sandbox = Sandbox(work / f"sbx{nodes}", nodes=nodes, gpus_per_node=0, link="1gbit")
    sandbox.up()
    try:
        out = work / f"out{nodes}"
        cmd = [sys.executable, "-m", "slurmtf.cli", "check", f"--nodes={nodes}",
               f"--out_dir={out}", f"--json={out}/verdict.json"]  # fmt: skip
        start = time.monotonic()
        done = subprocess.run(cmd, env=sandbox.env(), cwd=work, capture_output=True, text=True,
                              timeout=600, check=False)  # fmt: skip
        wall = time.monotonic() - start
        verdict = json.loads((out / "verdict.json").read_text()) if done.returncode < 2 else {}
        reference = reference_allreduce_gbps(sandbox, nodes, verdict.get("allreduce_mb", 4.0))
    finally:
        sandbox.down()
    rows = verdict.get("nodes", [])
    checked = rows[0]["allreduce_gbps"] if rows else None
    return {
        "nodes": nodes,
        "exit": done.returncode,
        "wall_s": wall,
        "step_s": verdict.get("seconds"),
        "phases_s": verdict.get("phases_s", {}),
        "link_out_gbps_median": statistics.median(r["link_out_gbps"] for r in rows)
        if rows
        else None,
        "allreduce_gbps": checked,
        "reference_allreduce_gbps": reference,
        "agreement": checked / reference if checked and reference else None,
        "closing": done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr,
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def reference_allreduce_gbps(sandbox: Sandbox, nodes: int, mbytes: float) -> float:
    """Bus bandwidth (Gbit/s) of ``bench_links``' all-reduce on the sandbox's links."""
    size = int(mbytes * harness.MB)
    argv = [harness.python(), "-m", "benchmarks.bench_links", "--worker", "--iters", "5",
            "--sizes", str(size), "--dtypes", "fp32"]  # fmt: skip
    done = subprocess.run(["srun", f"-N{nodes}", "--ntasks-per-node=1", *argv],
                          env=sandbox.env(), cwd=harness.REPO, capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    per_rank = [e for e in parse_events(done.stdout) if e["event"] == "links_allreduce"]
    if done.returncode != 0 or len(per_rank) != nodes:
        raise RuntimeError(
            f"reference all-reduce failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    seconds = max(rank["results"][0]["seconds"] for rank in per_rank)
    return harness.bus_bandwidth(size, seconds, nodes) * 8 / 1e9


def run(options: Options) -> JSONDict:
    text = "4" if options.quick else options.flag("sizes", "4,16")
    sizes = [int(n) for n in text.split(",") if n]  # --sizes= : the all-gather at width only
    wide = "16,64" if options.quick else options.flag("mesh_sizes", "16,64,256,1024")
    mesh = [mesh_width(int(n)) for n in wide.split(",") if n]
    with tempfile.TemporaryDirectory(prefix="bench-check-") as tmp:
        return {"results": [measure(n, Path(tmp)) for n in sizes], "mesh": mesh}


def markdown(result: JSONDict) -> str:
    rows = [
        [r["nodes"], r["exit"], r["wall_s"], r["step_s"], r["phases_s"].get("links"),
         r["phases_s"].get("import"), r["phases_s"].get("strategy"), r["phases_s"].get("allreduce"),
         r["phases_s"].get("compute"), r["link_out_gbps_median"], r["allreduce_gbps"],
         r.get("reference_allreduce_gbps"), r.get("agreement")]
        for r in result["results"]
    ]  # fmt: skip
    headers = ["nodes", "exit", "wall s", "step s", "links done s", "TF imported s",
               "strategy built s", "all-reduce done s", "compute done s", "link out Gb/s (median)",
               "all-reduce Gb/s", "bench_links all-reduce Gb/s", "check / bench_links"]  # fmt: skip
    text = harness.markdown_table(headers, rows)
    mesh = [[m["ranks"], min(m["allgather_s"]), max(m["allgather_s"]), m["peak_threads"],
             m["listen_overflows"]] for m in result.get("mesh", [])]  # fmt: skip
    if mesh:
        text += "\n" + harness.markdown_table(
            ["all-gather ranks (threads of one process)", "fastest s", "slowest s",
             "threads at once", "connects dropped"], mesh)  # fmt: skip
    return text


BENCHMARK = protocol.declare(__name__, Benchmark(
    "check", "slurmtf check: wall time on sandbox nodes", run, markdown,
    description=__doc__, arguments=_arguments,
))  # fmt: skip
