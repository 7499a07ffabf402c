"""Goodput under failures: the same job undisturbed and with a failure every N seconds.

One sandbox of 2 nodes; ``sbatch -N2 jobs/mnist.sbatch`` with the same seed and steps
each run. The first run is undisturbed. In each other run, from rank 0's first step on,
one failure every ``--every`` seconds (45 by default) until the job ends:

* ``rank``: a rank's Python process gets SIGKILL (rank 1 and rank 0 in turn);
* ``freeze``: rank 1's process gets SIGSTOP (a hung rank: TensorFlow's heartbeat);
* ``supervisor``: the job's supervisor gets SIGKILL (its keeper starts it again);
* ``spare``: the node of rank 1 hangs (its slurmd, step daemons and ranks get SIGSTOP)
  and the job trains on a spare: a sandbox of its own with ``SPARE_NODES`` enough for
  every failure of the run (``--spares``), each hung node left hung to the end.

Goodput is the undisturbed training time (rank 0's first step event to its last) over
the disturbed one. Beside it, what ``slurmtf status`` sums from rank 0's events
(slurmtf.monitor.failure_cost): failures, seconds lost, steps redone, its own goodput;
and whether the final weights checksum equals the undisturbed one.

    python -m benchmarks.bench_goodput [--kinds rank,freeze,supervisor,spare] [--every 45]
        [--warm 1] [--spares 8]

``--warm`` is every run's ``SLURMTF_WARM_STANDBY`` (``auto`` by default): with warm
ranks, a killed rank's restart takes over the next attempt's waiting step.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness, protocol
from benchmarks.harness import JSONDict
from benchmarks.protocol import Benchmark, Options
from slurmtf.events import named, read_events
from slurmtf.monitor.failure_cost import job_cost
from slurmtf.runtime.recovery.record import read_record
from slurmtf.sandbox import Sandbox, nodefaults

KINDS = ("rank", "freeze", "supervisor", "spare")
ENDED = {"FAILED", "CANCELLED", "COMPLETED", "TIMEOUT", "NODE_FAIL"}
ARGS = [
    "--batch_size=16", "--eval_steps=1", "--num_threads=1", "--seed=7", "--log_every=5",
    "--checkpoint_every=100", "--heartbeat_timeout=10",
]  # fmt: skip


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kinds", default=",".join(KINDS), help="failure kinds to run")
    parser.add_argument("--every", type=float, default=45.0, help="seconds between failures")
    parser.add_argument("--steps", type=int, default=600, help="--train_steps of each run")
    parser.add_argument("--warm", default="auto", help="SLURMTF_WARM_STANDBY of every run")
    parser.add_argument("--spares", type=int, default=8, help="spare nodes of the spare run")


def submit(sandbox: Sandbox, run: Path, steps: int, warm: str, spares: int = 0) -> str:
    env = {"MODEL_DIR": str(run / "model"), "LOG_DIR": str(run / "logs"),
           "MAX_RESTARTS": "100", "PYTHON": harness.python(),
           "SLURMTF_WARM_STANDBY": warm, "SPARE_NODES": str(spares)}  # fmt: skip
    run.mkdir(parents=True, exist_ok=True)
    sbatch = [f"-N{2 + spares}", "--ntasks-per-node=1", "--gres=none", "--time=60",
              f"--job-name=goodput-{run.name}", f"--output={run}/job.out",
              str(harness.REPO / "jobs" / "mnist.sbatch")]  # fmt: skip
    flags = [*ARGS, *harness.exact_once_flags(), f"--train_steps={steps}"]
    return harness.submit_job(sandbox, [*sbatch, *flags], env)


def node_of(pid: int) -> str:
    """The sandbox node a job process runs on (its ``SLURMD_NODENAME``)."""
    try:
        items = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return ""
    found = [i.split(b"=", 1)[1] for i in items if i.startswith(b"SLURMD_NODENAME=")]
    return found[0].decode() if found else ""


def fail_once(kind: str, job_id: str, count: int, sandbox: Sandbox, stopped: list[int]) -> bool:
    """The ``count``-th failure of ``kind`` (``stopped`` gets the PIDs a hung node
    stopped); False when its process was not found."""
    found = harness.job_processes(job_id)
    if kind == "spare":  # rank 1 of the attempt that trains: a hung node's stays listed
        live = [pid for pid in found.get("rank1", []) if pid not in stopped]
        node = node_of(live[0]) if live else ""
        stopped.extend(nodefaults.freeze_node(sandbox, node) if node else [])
        return bool(node)
    if kind == "supervisor":
        pids = found.get("batch", [])
        sig = signal.SIGKILL
    else:
        rank = count % 2 if kind == "rank" else 1
        pids = found.get(f"rank{rank}", [])
        sig = signal.SIGKILL if kind == "rank" else signal.SIGSTOP
    for pid in pids[:1]:
        os.kill(pid, sig)
    return bool(pids)


def training_seconds(out: Path) -> float:
    """Rank 0's first step event to its last (events carry their time)."""
    times = [float(e["time"]) for e in read_events(out)
             if e.get("event") in ("progress", "done") and "time" in e]  # fmt: skip
    return times[-1] - times[0] if len(times) > 1 else 0.0


def measure(
    sandbox: Sandbox, kind: str, work: Path, every: float, steps: int, *, warm: str = "auto",
    spares: int = 0,
) -> JSONDict:  # fmt: skip
    """One run of ``kind`` (``none``: undisturbed) until the job ends; a hung node's
    processes are mended afterwards."""
    run = work / kind
    out = run / "logs" / "rank0.out"
    job_id = submit(sandbox, run, steps, warm, spares)
    harness.wait_until("step 1", lambda: harness.last_step(out) >= 1
                       or harness.job_state(sandbox, job_id) in ENDED, 600)  # fmt: skip
    failures, next_at, state = 0, time.monotonic() + every, ""
    stopped: list[int] = []
    try:
        while (state := harness.job_state(sandbox, job_id)) not in ENDED and state:
            if kind != "none" and time.monotonic() >= next_at:
                failures += fail_once(kind, job_id, failures, sandbox, stopped)
                next_at = time.monotonic() + every
            time.sleep(0.5)
    finally:
        if stopped:
            nodefaults.mend(sandbox, stopped, timeout=180)
    chief = read_events(out)
    cost = job_cost(chief, read_record(run / "logs", job_id))
    done = named(chief, "done")
    return {
        "kind": kind, "state": state, "failures_made": failures,
        "training_s": round(training_seconds(out), 1),
        "final_step": done[-1].get("step") if done else None,
        "checksum": done[-1].get("weights_checksum") if done else None,
        "status_failures": cost.failures, "status_lost_s": cost.seconds_lost,
        "status_redone": cost.steps_redone, "status_goodput": cost.goodput,
        "load": [round(x, 2) for x in os.getloadavg()],
    }  # fmt: skip


def run(options: Options) -> JSONDict:
    kinds = ["rank"] if options.quick else options.flag("kinds", ",".join(KINDS)).split(",")
    every, steps = float(options.flag("every", 45.0)), int(options.flag("steps", 600))
    warm, spares = str(options.flag("warm", "auto")), int(options.flag("spares", 8))
    with tempfile.TemporaryDirectory(prefix="bench-goodput-") as tmp:
        sandbox = Sandbox(Path(tmp) / "sbx", nodes=2)
        sandbox.up()
        try:
            results = [measure(sandbox, "none", Path(tmp), every, steps, warm=warm)]
            for kind in (k for k in kinds if k != "spare"):
                results.append(measure(sandbox, kind, Path(tmp), every, steps, warm=warm))
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        finally:
            sandbox.down()
        if "spare" in kinds:  # a sandbox with a spare node for every failure
            sandbox = Sandbox(Path(tmp) / "spares", nodes=2 + spares)
            sandbox.up()
            try:
                results.append(measure(sandbox, "spare", Path(tmp), every, steps, warm=warm,
                                       spares=spares))  # fmt: skip
            finally:
                sandbox.down()
    base = results[0]
    for result in results:
        result["goodput"] = (
            round(base["training_s"] / result["training_s"], 3) if result["training_s"] else None
        )
        result["same_weights"] = result["checksum"] == base["checksum"]
    return {"every_s": every, "steps": steps, "warm": warm, "spares": spares, "results": results,
            "tensorflow": harness.package_version("tensorflow", "tensorflow-cpu")}  # fmt: skip


def markdown(result: JSONDict) -> str:
    rows = [
        [r["kind"], r["state"], r["failures_made"], r["training_s"], r["goodput"],
         r["status_lost_s"], r["status_redone"], r["status_goodput"],
         "same" if r["same_weights"] else "other"]
        for r in result["results"]
    ]  # fmt: skip
    headers = ["failure", "job", "failures", "training s", "goodput", "status: s lost",
               "status: steps redone", "status: goodput", "final weights"]  # fmt: skip
    return harness.markdown_table(headers, rows)


BENCHMARK = protocol.declare(__name__, Benchmark(
    "goodput", "Goodput with a failure every N seconds (2-worker MNIST)", run, markdown,
    description=__doc__, arguments=_arguments,
))  # fmt: skip
