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

    python -m benchmarks.bench_check [--quick] [--sizes 4,16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness, protocol
from benchmarks.harness import JSONDict
from benchmarks.protocol import Benchmark, Options
from slurmtf.events import parse_events
from slurmtf.sandbox import Sandbox


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="4,16", help="node counts (default 4,16)")


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
    from benchmarks import bench_links

    size = int(mbytes * bench_links.MB)
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
    sizes = [4] if options.quick else [int(s) for s in options.flag("sizes", "4,16").split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-check-") as tmp:
        return {"results": [measure(n, Path(tmp)) for n in sizes]}


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
    return harness.markdown_table(headers, rows)


BENCHMARK = protocol.declare(__name__, Benchmark(
    "check", "slurmtf check: wall time on sandbox nodes", run, markdown,
    description=__doc__, arguments=_arguments,
))  # fmt: skip
