"""What watching the batch host costs, and how long each failure of the job's batch side
takes to training again.

One sandbox (3 nodes, ``SlurmdTimeout`` 60 s; the Slurm of ``SLURMTF_SLURM_PREFIX``,
Debian's by default), one 2-node ``sbatch jobs/mnist.sbatch`` job per case
(``MAX_RESTARTS=2``, the default heartbeat of 5 s), broken at step 12 or, after the
sampling below, at once:

* ``supervisor_kill``: the supervisor gets SIGKILL (as from the OOM killer): its keeper
  starts it again in place;
* ``supervisor_stop``: the supervisor alone gets SIGSTOP (alive but stuck): the watcher
  notices, its keeper ends it and starts it again;
* ``host_freeze``: the batch host freezes (its slurmd and every process of the job on it
  get SIGSTOP): the watcher requeues the job without it.

In the first case, for ``--sample_s`` seconds of training before the failure, the
benchmark samples from ``/proc`` the watcher's task (the ``slurmtf watcher`` process on
its node), the watcher step's slurmstepd there, its srun on the batch host, the keeper
and the supervisor: threads, RSS and CPU seconds, hence CPU per minute. Kept per case:
seconds from the failure to rank 0's first step after its next ``cluster`` event, the
steps lost, Slurm's restart count and the job's end.

    SLURMTF_SLURM_PREFIX=/opt/slurm-26.05.3 python -m benchmarks.bench_batch_host [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from benchmarks import harness, protocol
from benchmarks.harness import JSONDict, parent, processes
from benchmarks.protocol import Benchmark, Options
from slurmtf.runtime.batch_host.heartbeat import beat_path, read_beat
from slurmtf.sandbox import Sandbox, nodefaults

CASES = ("supervisor_kill", "supervisor_stop", "host_freeze")
SLURMD_TIMEOUT = 60
BREAK_AT = 12
STEPS = 600  # the job outlives the sampling before the failure
ARGS = ["--batch_size=16", "--eval_steps=1", "--num_threads=1", "--seed=7", "--log_every=1",
        f"--train_steps={STEPS}", "--checkpoint_every=5", "--heartbeat_timeout=10"]  # fmt: skip
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", default=",".join(CASES), help="failures to run")
    parser.add_argument("--sample_s", type=float, default=60.0, help="seconds of sampling")


def batch_side(job_id: str) -> dict[str, int]:
    """The job's batch-side processes on this machine: ``keeper``, ``supervisor``,
    ``watcher`` (its task), ``watcher_srun`` (its srun, on the batch host),
    ``watcher_stepd`` (its step daemon, on the watcher's node)."""
    found: dict[str, int] = {}
    jobs: list[int] = []
    for pid, argv, environ in processes():
        words = [a.decode(errors="replace") for a in argv if a]
        if f"SLURM_JOB_ID={job_id}".encode() not in environ:
            continue
        if words[1:4] == ["-m", "slurmtf", "job"]:
            jobs.append(pid)
        elif words[1:4] == ["-m", "slurmtf.cli", "watcher"]:
            found["watcher"] = pid
        elif words[:1] == ["srun"] and "watcher" in words:
            found["watcher_srun"] = pid
    for pid in jobs:
        found["supervisor" if parent(pid) in jobs else "keeper"] = pid
    if "watcher" in found:
        found["watcher_stepd"] = parent(found["watcher"])
    return found


def sample(pids: dict[str, int]) -> JSONDict:
    row: JSONDict = {"time": time.monotonic()}
    for name, pid in pids.items():
        row[name] = {**(harness.proc_figures(pid) or {}), "cpu_s": harness.cpu_seconds(pid)}
    return row


def cost(first: JSONDict, last: JSONDict) -> JSONDict:
    """Per process: threads and RSS at the end, CPU seconds per minute in between."""
    minutes = (last["time"] - first["time"]) / 60
    out: JSONDict = {"minutes": round(minutes, 2)}
    for name, figures in last.items():
        if name == "time" or not isinstance(figures, dict):
            continue
        before = first.get(name, {}).get("cpu_s")
        after = figures.get("cpu_s")
        per_minute = None
        if isinstance(before, float) and isinstance(after, float) and minutes > 0:
            per_minute = round((after - before) / minutes, 4)
        out[name] = {"threads": figures.get("threads"), "rss_kb": figures.get("rss_kb"),
                     "cpu_s_per_min": per_minute}  # fmt: skip
    return out


def job_state(sandbox: Sandbox, job_id: str) -> JSONDict:
    done = sandbox.run(["scontrol", "-o", "show", "job", job_id], check=False)
    words = dict(w.split("=", 1) for w in done.stdout.split() if "=" in w)
    return {"state": words.get("JobState", ""), "restarts": words.get("Restarts", "")}


def break_it(sandbox: Sandbox, case: str, run: Path, job_id: str) -> list[int]:
    """Break the batch side the ``case`` way; the PIDs stopped (to mend afterwards)."""
    beat = read_beat(beat_path(run / "logs", job_id))
    if beat is None:
        raise RuntimeError(f"job {job_id} has no heartbeat in {run}/logs")
    if case == "host_freeze":
        return nodefaults.freeze_node(sandbox, beat.host)
    os.kill(beat.pid, signal.SIGKILL if case == "supervisor_kill" else signal.SIGSTOP)
    return [beat.pid] if case == "supervisor_stop" else []


def measure(sandbox: Sandbox, case: str, work: Path, sample_s: float) -> JSONDict:
    run = work / case
    out = run / "logs" / "rank0.out"  # rank 0's events
    run.mkdir(parents=True)
    env = {"MODEL_DIR": str(run / "model"), "LOG_DIR": str(run / "logs"),
           "MAX_RESTARTS": "2", "PYTHON": harness.python()}  # fmt: skip
    script = str(harness.REPO / "jobs" / "mnist.sbatch")
    options = ["-N2", "--time=30", f"--job-name={case}", f"--output={run}/job.out"]
    job_id = harness.submit_job(sandbox, [*options, script, *ARGS], env)
    stopped: list[int] = []
    result: JSONDict = {"case": case}
    try:
        harness.wait_until("step 1", lambda: harness.last_step(out) >= 1, 300)
        if case == CASES[0] and sample_s:
            pids = batch_side(job_id)
            first = sample(pids)
            time.sleep(sample_s)
            result["cost"] = cost(first, sample(pids))
        harness.wait_until(f"step {BREAK_AT}", lambda: harness.last_step(out) >= BREAK_AT, 300)
        if job_state(sandbox, job_id)["state"] != "RUNNING":
            raise RuntimeError(f"job {job_id} ended before its failure: {run}/job.out")
        before = harness.last_step(out)
        stopped = break_it(sandbox, case, run, job_id)
        broken = time.monotonic()
        harness.wait_until("training again", lambda: harness.resumed_step(out) is not None, 600)
        result["seconds"] = round(time.monotonic() - broken, 1)
        result["steps_lost"] = max(0, before - (harness.resumed_step(out) or 0) + 1)
        harness.wait_until("the end", lambda: job_state(sandbox, job_id)["state"] in ENDED, 600)
        result.update(job_state(sandbox, job_id))
        text = (run / "job.out").read_text(errors="replace")
        result["said"] = [x.split("slurmtf: ", 1)[1] for x in text.splitlines()
                          if "slurmtf: " in x and ("supervisor" in x or "host" in x)]  # fmt: skip
    finally:
        sandbox.run(["scancel", job_id], check=False)
        nodefaults.mend(sandbox, stopped, timeout=180)
    result["load"] = [round(x, 2) for x in os.getloadavg()]
    return result


def run(options: Options) -> JSONDict:
    cases = ["supervisor_kill"] if options.quick else options.flag("cases", ",".join(CASES))
    if isinstance(cases, str):
        cases = cases.split(",")
    sample_s = 20.0 if options.quick else float(options.flag("sample_s", 60.0))
    with tempfile.TemporaryDirectory(prefix="bench-batch-host-") as tmp:
        sandbox = Sandbox(Path(tmp) / "sbx", nodes=3, slurmd_timeout=SLURMD_TIMEOUT)
        sandbox.up()
        try:
            release = sandbox.config().slurm_release or "Debian's"
            results = []
            for case in cases:
                results.append(measure(sandbox, case, Path(tmp), sample_s))
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        finally:
            sandbox.down()
    return {"slurm": release, "slurmd_timeout": SLURMD_TIMEOUT, "results": results}


def _rows(results: Iterable[JSONDict]) -> list[list[object]]:
    return [[r["case"], r.get("seconds"), r.get("steps_lost"), r.get("restarts"),
             r.get("state"), " ".join(map(str, r.get("load", [])))] for r in results]  # fmt: skip


def markdown(result: JSONDict) -> str:
    headers = ["failure", "s to training again", "steps lost", "Slurm restarts", "end", "load"]
    out = f"Slurm {result['slurm']}, SlurmdTimeout {result['slurmd_timeout']} s\n\n"
    out += harness.markdown_table(headers, _rows(result["results"]))
    costs = [r["cost"] for r in result["results"] if r.get("cost")]
    if costs:
        rows = [[name, f.get("threads"), f.get("rss_kb"), f.get("cpu_s_per_min")]
                for name, f in costs[0].items() if isinstance(f, dict)]  # fmt: skip
        out += f"\nover {costs[0]['minutes']} min of training:\n\n"
        out += harness.markdown_table(["process", "threads", "RSS kB", "CPU s per min"], rows)
    return out


BENCHMARK = protocol.declare(__name__, Benchmark(
    "batch_host", "batch host: the watcher's cost, the batch side's failures to training",
    run, markdown, description=__doc__, arguments=_arguments,
))  # fmt: skip
