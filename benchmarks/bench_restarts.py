"""Ten rank kills in a row in one job: threads, fds and memory stay flat, nothing is left.

One ``sbatch jobs/mnist.sbatch`` job of 2 nodes x 2 tasks (``--ntasks-per-node=2``,
``MAX_RESTARTS=10``) on a 2-node sandbox. At the same point of every attempt (rank 0's
first training step after it started) the benchmark samples, from ``/proc``:

* the job's supervisor (``slurmtf job``, the child of its keeper, the process the batch
  script became: threads, fds, RSS and CPU seconds so far): it runs srun in place again
  and again, so anything it leaks grows with the restarts, and its CPU over the job's
  wall time is what it costs while the ranks train;
* every ``slurmstepd`` of the job (how many, and their threads, fds and RSS summed);
* each rank's training process (threads, fds, RSS), and how many rank processes of the
  job exist (exactly one per rank: the last attempt's ranks are gone);

then SIGKILLs rank 1 (its PID), 10 times. The 11th attempt trains to the end. After the
job: no process of the job (no rank, no slurmstepd) on any node. PASS when the job
COMPLETED after 10 restarts in place and the last attempt's figures are within the
flatness limits (:data:`LIMITS`) of the first.

    python -m benchmarks.bench_restarts [--quick] [--kills 10]
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks import harness, protocol
from benchmarks.harness import JSONDict
from benchmarks.protocol import Benchmark, Options
from slurmtf.sandbox import Sandbox

ARGS = ["--batch_size=16", "--eval_steps=1", "--num_threads=1", "--seed=3", "--log_every=1",
        "--checkpoint_every=5", "--heartbeat_timeout=10", "--train_steps=600"]  # fmt: skip
# (figure, most it may grow from the first attempt's sample to the last's)
LIMITS = {
    "batch_threads": 0,
    "batch_fds": 0,
    "batch_rss_kb": 2048,
    "stepds": 0,
    "stepd_threads": 2,
    "stepd_fds": 2,
    "stepd_rss_kb": 8192,
    "rank_threads_max": 20,
    "rank_fds_max": 10,
    "rank_rss_kb_max": 65536,
    "rank_processes": 0,
}


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kills", type=int, default=10, help="rank kills in a row (10)")


def sample(job_id: str, tasks: int) -> JSONDict:
    """One row: the batch bash, the slurmstepds (summed), each rank, the process counts."""
    procs = harness.job_processes(job_id)
    row: JSONDict = {"time": round(time.time(), 1)}
    (batch,) = procs.get("batch", [0])[:1] or [0]
    for key, value in (harness.proc_figures(batch) or {}).items():
        row[f"batch_{key}"] = value
    row["batch_cpu_s"] = harness.cpu_seconds(batch)
    stepds = [f for f in (harness.proc_figures(p) for p in procs.get("stepd", [])) if f]
    row["stepds"] = len(stepds)
    for key in ("threads", "fds", "rss_kb"):
        row[f"stepd_{key}"] = sum(f[key] for f in stepds)
    ranks = [harness.proc_figures(p) for r in range(tasks) for p in procs.get(f"rank{r}", [])]
    row["rank_processes"] = sum(len(procs.get(f"rank{r}", [])) for r in range(tasks))
    for key in ("threads", "fds", "rss_kb"):
        row[f"rank_{key}"] = [f[key] if f else None for f in ranks]
        row[f"rank_{key}_max"] = max((f[key] for f in ranks if f), default=0)
    return row


def verdicts(rows: Sequence[Mapping[str, object]], limits: Mapping[str, int]) -> JSONDict:
    """Per figure: first, last, growth, its limit, ok. The first row is attempt 0's."""
    out: JSONDict = {}
    if len(rows) < 2:
        return out
    for key, limit in limits.items():
        first, last = rows[0].get(key), rows[-1].get(key)
        if not isinstance(first, int) or not isinstance(last, int):
            out[key] = {"first": first, "last": last, "ok": False}
            continue
        growth = last - first
        out[key] = {"first": first, "last": last, "growth": growth, "limit": limit,
                    "ok": growth <= limit}  # fmt: skip
    return out


def passed(result: Mapping[str, object]) -> bool:
    """COMPLETED, every kill restarted in place, flat, and nothing of the job left."""
    flat = result.get("flatness") or {}
    return bool(
        result.get("state") == "COMPLETED"
        and result.get("restarts_in_place") == result.get("kills")
        and result.get("slurm_restarts") == 0
        and isinstance(flat, dict)
        and flat
        and all(v.get("ok") for v in flat.values())
        and result.get("left_after_job") == {}
    )


def state(sandbox: Sandbox, job_id: str) -> str:
    done = sandbox.run(["scontrol", "-o", "show", "job", job_id], check=False)
    found = [w for w in done.stdout.split() if w.startswith(("JobState=", "Restarts="))]
    return " ".join(found)


def drive(sandbox: Sandbox, job_id: str, logs: Path, kills: int) -> list[JSONDict]:
    """Sample each attempt at its first step, SIGKILL rank 1, ``kills`` times; then sample
    the last attempt once."""
    rows: list[JSONDict] = []
    for attempt in range(kills + 1):
        deadline = time.monotonic() + 300
        while not harness.attempt_started(logs / "rank0.out", attempt):
            if time.monotonic() > deadline or not live(state(sandbox, job_id)):
                return rows
            time.sleep(0.3)
        rows.append({"attempt": attempt, **sample(job_id, 4)})
        if attempt < kills:
            rows[-1]["kill_to_new_step_s"] = kill_rank(job_id, "rank1")
    return rows


def kill_rank(job_id: str, rank: str, timeout: float = 120) -> float | None:
    """SIGKILL ``rank``'s process; seconds until the next step's ranks are running (a
    process of every rank kind seen before, none of the killed attempt's)."""
    before = harness.job_processes(job_id)
    old = {pid for kind, pids in before.items() if kind.startswith("rank") for pid in pids}
    kinds = {kind for kind in before if kind.startswith("rank")}
    killed = time.monotonic()
    for pid in before.get(rank, []):
        os.kill(pid, signal.SIGKILL)
    while time.monotonic() - killed < timeout:
        now = harness.job_processes(job_id)
        fresh = {k for k in kinds if any(p not in old for p in now.get(k, []))}
        if fresh == kinds:
            return round(time.monotonic() - killed, 2)
        time.sleep(0.05)
    return None


def measure(work: Path, kills: int) -> JSONDict:
    sandbox = Sandbox(work / "sbx", nodes=2, gpus_per_node=0)
    sandbox.up()
    job_id = ""
    try:
        logs, model = work / "logs", work / "model"
        env = {"LOG_DIR": str(logs), "MODEL_DIR": str(model), "MAX_RESTARTS": str(kills)}
        sbatch = ["-N2", "--ntasks-per-node=2", "--gres=none", "--time=30",
                  f"--output={work}/job-%j.out"]  # fmt: skip
        script = str(harness.REPO / "jobs" / "mnist.sbatch")
        job_id = harness.submit_job(sandbox, [*sbatch, script, *ARGS], env)
        rows = drive(sandbox, job_id, logs, kills)
        final = wait_final(sandbox, job_id, 900)
        time.sleep(2)  # let Slurm reap the last step daemons
        left = harness.job_processes(job_id)
        text = next(work.glob("job-*.out")).read_text(errors="replace")
    finally:
        if job_id:
            sandbox.run(["scancel", job_id], check=False)
        sandbox.down()
    return summarize(rows, final, left, text, kills)


def summarize(rows: list[JSONDict], final: str, left: Mapping[str, list[int]],
              text: str, kills: int) -> JSONDict:  # fmt: skip
    fields = dict(w.split("=", 1) for w in final.split() if "=" in w)
    result: JSONDict = {
        "kills": kills,
        "state": fields.get("JobState", "?"),
        "slurm_restarts": int(fields.get("Restarts", "-1")),
        "restarts_in_place": text.count(" in place ("),
        "samples": rows,
        "flatness": verdicts(rows, LIMITS),
        "left_after_job": {k: v for k, v in left.items() if v},
        "supervisor_cpu_s_per_min": cpu_per_minute(rows),
        "load": [round(x, 2) for x in os.getloadavg()],
    }
    result["pass"] = passed(result)
    return result


def cpu_per_minute(rows: Sequence[Mapping[str, object]]) -> float | None:
    """The supervisor's CPU seconds per minute of the job, first sample to last."""
    cpu = [(r.get("time"), r.get("batch_cpu_s")) for r in rows]
    known = [(float(t), float(c)) for t, c in cpu if isinstance(t, float | int) and
             isinstance(c, float | int)]  # fmt: skip
    if len(known) < 2 or known[-1][0] <= known[0][0]:
        return None
    return round((known[-1][1] - known[0][1]) / ((known[-1][0] - known[0][0]) / 60), 3)


def kill_to_training(rows: Sequence[Mapping[str, object]]) -> list[float]:
    """Seconds from each kill (right after a sample) to the next attempt's first step."""
    times = [float(t) for t in (r.get("time") for r in rows) if isinstance(t, int | float)]
    return [round(b - a, 1) for a, b in itertools.pairwise(times)]


def live(words: str) -> bool:
    """A job still pending, starting, running or ending (scontrol's ``JobState=``)."""
    states = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING")
    return any(f"JobState={s}" in words for s in states)


def wait_final(sandbox: Sandbox, job_id: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = state(sandbox, job_id)
        if now and not live(now):
            return now
        time.sleep(1)
    return state(sandbox, job_id)


def run(options: Options) -> JSONDict:
    kills = 2 if options.quick else int(options.flag("kills", 10))
    with tempfile.TemporaryDirectory(prefix="bench-restarts-") as tmp:
        result = measure(Path(tmp), kills)
    print(markdown(result))
    print("PASS" if result["pass"] else "FAIL")
    return result


def markdown(result: JSONDict) -> str:
    keys = ["batch_threads", "batch_fds", "batch_rss_kb", "batch_cpu_s", "stepds", "stepd_threads",
            "stepd_fds", "stepd_rss_kb", "rank_processes", "rank_threads_max", "rank_fds_max",
            "rank_rss_kb_max"]  # fmt: skip
    rows = [[r.get("attempt"), *(r.get(k) for k in keys)] for r in result["samples"]]
    table = harness.markdown_table(["attempt", *keys], rows)
    verdict = "PASS" if result.get("pass") else "FAIL"
    seconds = kill_to_training(result["samples"])
    again = f"kill to training again: {min(seconds)}-{max(seconds)} s; " if seconds else ""
    steps = [r["kill_to_new_step_s"] for r in result["samples"] if r.get("kill_to_new_step_s")]
    again += f"kill to the new step's ranks: {min(steps)}-{max(steps)} s; " if steps else ""
    restarts = result["restarts_in_place"]
    return (
        f"{table}\n\n{again}{verdict}: job {result['state']}, {restarts} restarts "
        f"in place of {result['kills']} kills, Slurm Restarts={result['slurm_restarts']}, left "
        f"after the job: {result['left_after_job'] or 'nothing'}, supervisor CPU "
        f"{result.get('supervisor_cpu_s_per_min')} s per minute, load {result['load']}\n"
    )


BENCHMARK = protocol.declare(__name__, Benchmark(
    "restarts", "Ten rank kills in one job: resources flat, nothing left", run, markdown,
    description=__doc__, arguments=_arguments,
))  # fmt: skip
