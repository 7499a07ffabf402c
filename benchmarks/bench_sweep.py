"""The results table of a 1,000-point sweep: ``slurmtf sweep`` and ``slurmtf status`` on a
job array of 1,000 tasks.

On a sandbox (4 nodes), one job array of ``--points`` tasks (``sbatch --array=0-999``;
each task ends at once) gives Slurm's side: ``scontrol -o show job`` of the array, as
the table asks it. Each point's rank 0 log is what a finished point of ``slurmtf submit
--sweep`` leaves (its launcher's ``launch`` event with the point's parameters, ``cluster``,
``progress``, ``eval``, ``done``, ``exit``; written with :func:`slurmtf.events.emit`) in
one folder, as submitit names them, and every task is in the record of submitted jobs as
``submit`` records them. Measured: the wall time of ``slurmtf sweep JOB`` (table,
``--csv``, ``--json``; median and slowest of 3) and of ``slurmtf status JOB`` while Slurm knows
the array, then of ``slurmtf sweep JOB`` when the controller does not answer (from the
record and the logs), and the rows each printed.

    python -m benchmarks.bench_sweep [--quick] [--points 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks import harness, protocol
from benchmarks.harness import JSONDict
from benchmarks.protocol import Benchmark, Options
from slurmtf.contracts import SUBMITIT_LOG_NAME
from slurmtf.events import emit
from slurmtf.monitor import records
from slurmtf.sandbox import Sandbox


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--points", type=int, default=1000, help="array tasks (default 1000)")


def write_point(folder: Path, task_id: str, index: int) -> None:
    """Rank 0's log of one finished point, as its launcher and training loop write it."""
    path = folder / SUBMITIT_LOG_NAME.format(job=task_id, rank=0, kind="out")
    params = {"learning_rate": round(10 ** (-4 + 3 * index / 1000), 6), "batch_size": 64}
    with path.open("w") as out, contextlib.redirect_stdout(out):
        emit("launch", rank=0, job_id=task_id, params=params, restart_count=0)
        emit("cluster", rank=0, num_workers=2, workers=["node1:12000", "node2:12001"])
        for step in (100, 200, 300):
            emit("progress", step=step, total=300, loss=1 / (step + index), accuracy=0.9,
                 examples_per_sec=1000.0)  # fmt: skip
        emit("eval", step=300, loss=0.05, accuracy=0.97)
        emit("done", rank=0, step=300, start_step=0)
        emit("exit", rank=0, status=0)
    path.with_suffix(".err").write_text("")


def timed(sandbox: Sandbox, args: list[str], env: dict[str, str]) -> JSONDict:
    """A slurmtf command's wall time (median and slowest of 3), its exit status, its lines."""
    times, done = [], None
    for _ in range(3):
        started = time.monotonic()
        done = subprocess.run([harness.python(), "-m", "slurmtf", *args], env=sandbox.env(env),
                              cwd=harness.REPO, capture_output=True, text=True, timeout=300,
                              check=False)  # fmt: skip
        times.append(time.monotonic() - started)
    assert done is not None
    return {"s": round(harness.median(times), 2), "max_s": round(max(times), 2),
            "exit": done.returncode,
            "lines": len(done.stdout.splitlines()), "bytes": len(done.stdout)}  # fmt: skip


def measure(points: int, work: Path) -> JSONDict:
    sandbox = Sandbox(work / "sbx", nodes=4, gpus_per_node=0, cpus_per_node=16)
    sandbox.up()
    try:
        job = harness.submit_job(sandbox, [f"--array=0-{points - 1}", "--output=/dev/null",
                                           "--wrap=true"])  # fmt: skip
        harness.wait_until("the array's end", lambda: not harness.queued(sandbox, job), 900, 2)
        folder = work / "logs"
        folder.mkdir()
        env = {"XDG_STATE_HOME": str(work / "state")}
        for task in range(points):
            write_point(folder, f"{job}_{task}", task)
            records.append(f"{job}_{task}", folder, SUBMITIT_LOG_NAME,
                           path=records.record_path(env))  # fmt: skip
        result: JSONDict = {"points": points, "job": job}
        for name, extra in (("table", []), ("csv", ["--csv"]), ("json", ["--json"])):
            result[f"sweep_{name}"] = timed(sandbox, ["sweep", job, *extra], env)
        result["status"] = timed(sandbox, ["status", job], env)
        silent = {**env, "SLURM_CONF": str(work / "no-such-slurm.conf")}
        result["sweep_silent"] = timed(sandbox, ["sweep", job, "--json"], silent)
        out = subprocess.run([harness.python(), "-m", "slurmtf", "sweep", job, "--json"],
                             env=sandbox.env(env), cwd=harness.REPO, capture_output=True,
                             text=True, timeout=300, check=False)  # fmt: skip
        rows = json.loads(out.stdout).get("points", []) if out.returncode == 0 else []
        result["rows_completed"] = sum(1 for r in rows if r.get("state") == "COMPLETED")
    finally:
        sandbox.down()
    return result


def run(options: Options) -> JSONDict:
    points = 50 if options.quick else int(options.flag("points", 1000))
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        return measure(points, Path(tmp))


def markdown(result: JSONDict) -> str:
    kinds = [("sweep_table", "slurmtf sweep JOB"), ("sweep_csv", "slurmtf sweep JOB --csv"),
             ("sweep_json", "slurmtf sweep JOB --json"), ("status", "slurmtf status JOB"),
             ("sweep_silent", "slurmtf sweep JOB --json, controller silent")]  # fmt: skip
    rows = [[what, result["points"], result[k]["s"], result[k]["max_s"], result[k]["exit"],
             result[k]["lines"], result[k]["bytes"]] for k, what in kinds]  # fmt: skip
    headers = ["command", "points", "median s", "slowest s", "exit", "lines", "bytes"]
    table = harness.markdown_table(headers, rows)
    return (
        f"{table}\nRows COMPLETED in the JSON: {result['rows_completed']} of {result['points']}.\n"
    )


BENCHMARK = protocol.declare(__name__, Benchmark(
    "sweep", "The table of a 1,000-point sweep", run, markdown,
    description=__doc__, arguments=_arguments,
))  # fmt: skip
