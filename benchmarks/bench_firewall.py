"""The per-job firewall's cost: wall time of the prolog and the epilog per job.

Run ``python -m benchmarks.bench_firewall`` (root, ``unshare``, ``nft``). Each size runs
the shipped ``prolog.sh`` and ``epilog.sh`` as slurmd would (no ``PATH``, the settings
beside ``SLURM_CONF``) in a private network and mount namespace whose ``/etc/hosts``
maps ``node1..nodeN``; the table is checked after each prolog and epilog.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import harness, protocol
from benchmarks.protocol import Benchmark, Options
from slurmtf.firewall import EPILOG, PROLOG, rules

SIZES = ((2, 8), (16, 8), (64, 16), (128, 8))  # (nodes, CPUs a node): up to 1,024 ranks
JOB_ID = 4242


def _worker(args: argparse.Namespace) -> int:
    """Inside the namespaces: bind the hosts file, time the scripts, print JSON."""
    work = Path(args.work)
    subprocess.run(["mount", "--bind", str(work / "hosts"), "/etc/hosts"], check=True)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    env = {
        "SLURM_JOB_ID": str(JOB_ID),
        "SLURM_NODELIST": f"node[1-{args.nodes}]",
        "SLURM_JOB_CPUS_PER_NODE": f"{args.cpus}(x{args.nodes})",
        "SLURM_JOB_UID": "1000",
        "SLURMD_NODENAME": "node1",
        "SLURM_CONF": str(work / "slurm.conf"),
    }
    table = rules.table_name(JOB_ID)
    times: dict[str, list[float]] = {"prolog": [], "epilog": []}
    for _ in range(args.repeat):
        for script, what in ((PROLOG, "prolog"), (EPILOG, "epilog")):
            start = time.perf_counter()
            subprocess.run([str(script)], env=env, check=True, capture_output=True)
            times[what].append((time.perf_counter() - start) * 1000)
            listed = subprocess.run(
                ["nft", "list", "tables"], capture_output=True, text=True, check=True
            )
            if (table in listed.stdout) != (what == "prolog"):
                print(json.dumps({"error": f"{what} left tables: {listed.stdout!r}"}))
                return 1
    print(json.dumps({k: statistics.median(v) for k, v in times.items()}))
    return 0


def measure(repeat: int, sizes: tuple[tuple[int, int], ...]) -> list[dict[str, Any]]:
    rows = []
    for nodes, cpus in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            (work / "slurm.conf").write_text("")
            log = work / "firewall.log"
            (work / rules.SETTINGS_NAME).write_text(
                rules.render_settings(sys.executable, log=str(log))
            )
            hosts = "127.0.0.1 localhost\n" + "".join(
                f"10.77.{i // 250}.{i % 250 + 1} node{i}\n" for i in range(1, nodes + 1)
            )
            (work / "hosts").write_text(hosts)
            done = subprocess.run(
                ["unshare", "--net", "--mount", sys.executable, "-m", "benchmarks.bench_firewall",
                 "--worker", "--work", str(work), "--nodes", str(nodes), "--cpus", str(cpus),
                 "--repeat", str(repeat)],
                capture_output=True, text=True, check=True, cwd=harness.REPO,
            )  # fmt: skip
            walls = json.loads(done.stdout.strip().splitlines()[-1])
            inner = [
                float(line.rsplit(" in ", 1)[1].split()[0])
                for line in log.read_text().splitlines()
                if " prolog job " in line and " in " in line
            ]
            rows.append(
                {
                    "nodes": nodes,
                    "cpus_per_node": cpus,
                    "prolog_ms": walls["prolog"],
                    "epilog_ms": walls["epilog"],
                    "prolog_python_ms": statistics.median(inner),
                    **table_size(nodes, cpus),
                }
            )
    return rows


def table_size(nodes: int, cpus: int) -> dict[str, int]:
    """The job's table as the prolog writes it: its port ranges and its ``nft`` text."""
    spans = rules.job_ports(JOB_ID, nodes * cpus)
    peers = tuple(f"10.77.{i // 250}.{i % 250 + 1}" for i in range(1, nodes + 1))
    text = rules.render_apply(rules.JobRules(JOB_ID, spans, peers, uid=1000))
    return {"port_ranges": len(spans), "ports": sum(b - a + 1 for a, b in spans),
            "table_bytes": len(text)}  # fmt: skip


def run(options: Options) -> dict[str, Any]:
    missing = [b for b in ("unshare", "nft") if shutil.which(b) is None]
    if missing:
        return {"name": "firewall", "pending": True, "reason": f"missing {', '.join(missing)}"}
    repeat = options.flag("repeat", None) or (3 if options.quick else 20)
    return {"name": "firewall", "repeat": repeat, "sizes": measure(repeat, SIZES)}


def markdown(result: dict[str, Any]) -> str:
    rows = [
        [r["nodes"], r.get("cpus_per_node", 8), r["prolog_ms"], r["prolog_python_ms"],
         r["epilog_ms"], r.get("port_ranges"), r.get("ports"), r.get("table_bytes")]
        for r in result.get("sizes", [])
    ]  # fmt: skip
    headers = ["job nodes", "CPUs each", "prolog.sh: median ms", "of it in Python",
               "epilog.sh: ms", "port ranges", "ports", "table bytes"]  # fmt: skip
    return harness.markdown_table(headers, rows)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, help="runs per size (default 20)")
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--nodes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cpus", type=int, default=8, help=argparse.SUPPRESS)


BENCHMARK = protocol.declare(__name__, Benchmark(
    "firewall", "Per-job firewall", run, markdown,
    description=__doc__, arguments=_arguments, worker=_worker,
))  # fmt: skip
