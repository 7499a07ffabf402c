"""Soak with failures: a job that loses a rank every minute stays flat, read from /proc.

    python -m benchmarks.soak_failures                      # 20 min, a kill every 60 s
    python -m benchmarks.soak_failures --minutes=5 --every=30 --warm=0

It starts a sandbox of ``--nodes`` nodes and submits ``jobs/mnist.sbatch`` with an
endless ``--train_steps``, ``SLURMTF_WARM_STANDBY=--warm`` and a restart budget that
outlasts the run. From the chief's first step on, every ``--every`` seconds one training
rank gets SIGKILL (rank 1, then rank 0, in turn). Every ``--sample_every`` seconds it reads
each of the job's processes on this machine from /proc (threads, VmRSS, open fds): the
supervisor, its keeper, every training rank and every waiting warm rank, and it counts
the job's processes and the files it keeps (its run folder, this machine's temporary
folder).

The supervisor and the keeper live through the whole run, so their own samples after
``--warmup`` must be flat. A rank lives from one failure to the next, so each life is one
point (its peak): the lives of the last fifth of the run against those of the first fifth
must be flat, training ranks and warm ranks alike. The process and file counts must not
grow, the job must still run at the end, and each restart redoes at most one step (what
``slurmtf status`` sums). Writes ``soak-failures.json``; exits 1 when anything grew or the
job died.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import JSONDict, growth_problems, trend
from slurmtf.events import named, read_events
from slurmtf.monitor.failure_cost import job_cost
from slurmtf.runtime.recovery.record import read_record

ARGS = ["--batch_size=16", "--eval_steps=1", "--num_threads=1", "--seed=7", "--log_every=5",
        "--checkpoint_every=100", "--train_steps=1000000000"]  # fmt: skip
LASTING = ("batch", "keeper")  # processes that live through the whole run
FIGURES = ("threads", "rss_kb", "fds")
TFEVENTS = ".tfevents."  # in the name of TensorBoard's event files
MAX_COUNT_GROWTH = 1.0  # processes or files, mean of the last fifth against the first


@dataclasses.dataclass(frozen=True)
class Plan:
    """How long, how often a rank dies, and how the job is laid out and sampled."""

    minutes: float = 20.0
    every: float = 60.0
    nodes: int = 2
    tasks_per_node: int = 1
    sample_every: float = 2.0
    warmup: float = 120.0
    warm: str = "1"  # SLURMTF_WARM_STANDBY of the job


def submit(sandbox: Any, plan: Plan, run: Path) -> str:
    env = {"MODEL_DIR": str(run / "model"), "LOG_DIR": str(run / "logs"),
           "MAX_RESTARTS": "100000", "PYTHON": harness.python(),
           "SLURMTF_WARM_STANDBY": plan.warm}  # fmt: skip
    run.mkdir(parents=True, exist_ok=True)
    sbatch = [f"--nodes={plan.nodes}", f"--ntasks-per-node={plan.tasks_per_node}",
              "--gres=none", f"--time={int(plan.minutes) + 15}", f"--output={run}/job.out",
              str(harness.REPO / "jobs" / "mnist.sbatch")]  # fmt: skip
    return harness.submit_job(sandbox, [*sbatch, *ARGS], env)


def kill_rank(job_id: str, count: int, ranks: int) -> bool:
    """SIGKILL the ``count``-th victim (ranks in turn, the last first); False when that
    rank's training process is not running now."""
    rank = ranks - 1 - count % ranks
    pids = harness.job_processes(job_id).get(f"rank{rank}", [])
    for pid in pids[:1]:
        os.kill(pid, signal.SIGKILL)
    return bool(pids)


def count_files(*roots: Path) -> int:
    """Files and folders under ``roots`` (0 for one that is missing), TensorBoard's event
    files left out: each summary writer starts a new one at each start of the chief, the
    run's record that TensorBoard reads as one (:func:`count_event_files`)."""
    return file_counts(listing(*roots))[0]


def count_event_files(*roots: Path) -> int:
    return file_counts(listing(*roots))[1]


def file_counts(names: set[str]) -> tuple[int, int]:
    """``(files kept, TensorBoard's event files)`` of one :func:`listing`."""
    events = sum(1 for name in names if TFEVENTS in name)
    return len(names) - events, events


def listing(*roots: Path) -> set[str]:
    """The paths of the files and folders under ``roots``."""
    return {str(path) for root in roots if root.exists() for path in root.rglob("*")}


def tmp_listing() -> set[str]:
    return {path.name for path in Path(tempfile.gettempdir()).iterdir()}


def sample(job_id: str, t: float, run: Path) -> tuple[list[JSONDict], JSONDict]:
    """One reading: each job process's figures, and the counts of processes and files."""
    found = harness.job_processes(job_id)
    rows = []
    for kind, pids in found.items():
        for pid in pids:
            figures = harness.proc_figures(pid)
            if figures is not None and kind not in ("other", "stepd"):
                rows.append({"t": t, "kind": kind, "pid": pid, **figures})
    files, event_files = file_counts(listing(run))  # one walk of the run folder
    counts = {
        "t": t,
        "processes": sum(len(pids) for pids in found.values()),
        "warm": sum(len(p) for k, p in found.items() if k.startswith("warm")),
        "files": files,
        "event_files": event_files,
        "tmp": len(tmp_listing()),
    }
    return rows, counts


def soak(sandbox: Any, plan: Plan, run: Path) -> JSONDict:
    """Run the job with its failures for ``plan.minutes``; the raw result."""
    job_id = submit(sandbox, plan, run)
    out = run / "logs" / "rank0.out"
    rows: list[JSONDict] = []
    counts: list[JSONDict] = []
    kills: list[float] = []
    first: tuple[set[str], set[str]] | None = None  # files and tmp entries after warm-up
    ranks = plan.nodes * plan.tasks_per_node
    try:
        harness.wait_until("the chief's first step", lambda: harness.last_step(out) >= 1
                           or not harness.queued(sandbox, job_id), 600)  # fmt: skip
        t0 = time.monotonic()
        next_kill = plan.every
        while (now := time.monotonic() - t0) < plan.minutes * 60:
            if harness.job_state(sandbox, job_id) != "RUNNING":
                break
            if now >= next_kill and kill_rank(job_id, len(kills), ranks):
                kills.append(round(now, 1))
                next_kill = now + plan.every
            got, counted = sample(job_id, round(now, 1), run)
            rows += got
            counts.append(counted)
            if first is None and now >= plan.warmup:
                first = (listing(run), tmp_listing())
            time.sleep(plan.sample_every)
        state = harness.job_state(sandbox, job_id)
        last = (listing(run), tmp_listing())
    finally:
        sandbox.run(["scancel", job_id], check=False)
    chief = read_events(out)
    cost = job_cost(chief, read_record(run / "logs", job_id))
    progress = named(chief, "progress")
    return {"name": "soak-failures", **dataclasses.asdict(plan), "job_id": job_id,
            "state": state, "kills_s": kills, "steps": progress[-1]["step"] if progress else 0,
            "status": dataclasses.asdict(cost), "machine": harness.machine_info(),
            "tensorflow": harness.package_version("tensorflow", "tensorflow-cpu"),
            "new_files": sorted(n for n in last[0] - first[0] if TFEVENTS not in n)
            if first else [],
            "new_tmp": sorted(last[1] - first[1]) if first else [],
            "samples": rows, "counts": counts}  # fmt: skip


def lives(rows: Sequence[JSONDict]) -> dict[str, list[JSONDict]]:
    """Per role (``rank0``, ``warm1``...), each process's life: when it was first seen
    and its peak figures. A warm rank that takes over has a warm life, then a rank life."""
    by_life: dict[tuple[str, int], JSONDict] = {}
    for row in rows:
        kind = str(row["kind"])
        if kind in LASTING:
            continue
        life = by_life.setdefault((kind, row["pid"]), {"t": row["t"], "samples": 0})
        life["samples"] += 1
        for key in FIGURES:
            life[key] = max(life.get(key, 0), row[key])
    roles: dict[str, list[JSONDict]] = {}
    for (kind, _), life in sorted(by_life.items(), key=lambda kv: kv[1]["t"]):
        roles.setdefault(kind, []).append(life)
    return roles


def _trends(points: Sequence[JSONDict], keys: Sequence[str], warmup: float) -> JSONDict:
    times = [p["t"] for p in points]
    return {key: trend(times, [p[key] for p in points], warmup) for key in keys}


def judge(result: JSONDict) -> JSONDict:
    """The trends of ``result`` and what grew: ``{"trends", "problems", "passed"}``."""
    warmup = float(result["warmup"])
    problems = [] if result["state"] == "RUNNING" else [f"job ended {result['state'] or 'gone'}"]
    trends: JSONDict = {}
    lasting = [(k, [r for r in result["samples"] if r["kind"] == k]) for k in LASTING]
    if not lasting[0][1]:
        problems.append("no supervisor seen")
    groups = [*((k, points) for k, points in lasting if points), *lives(result["samples"]).items()]
    for what, points in groups:
        if what in LASTING and len({p["pid"] for p in points}) > 1:
            problems.append(f"{what}: {len({p['pid'] for p in points})} processes, not one")
        try:
            trends[what] = _trends(points, FIGURES, warmup)
        except ValueError as exc:
            problems.append(f"{what}: {exc}")
            continue
        problems += growth_problems(what, trends[what])
    trends["counts"] = _trends(result["counts"], ("processes", "files", "tmp"), warmup)
    for key, t in trends["counts"].items():
        if t["growth"] > MAX_COUNT_GROWTH:
            problems.append(f"{key}: grew from {t['start']:.1f} to {t['end']:.1f}")
    status = result["status"]
    if status["failures"] < len(result["kills_s"]):
        kills = len(result["kills_s"])
        problems.append(f"{status['failures']} failures on record for {kills} kills")
    if status["steps_redone"] > status["failures"]:
        problems.append(f"{status['steps_redone']} steps redone in {status['failures']} failures")
    return {"trends": trends, "problems": problems, "passed": not problems}


def _cell(t: JSONDict, scale: float = 1.0, unit: str = "") -> str:
    return f"{t['start'] / scale:.0f} -> {t['end'] / scale:.0f}{unit} (max {t['max'] / scale:.0f})"


def markdown(result: JSONDict, judged: JSONDict) -> str:
    """One row per supervisor, keeper and rank role; the counts; the verdict."""
    rows = []
    roles = lives(result["samples"])
    for what, t in judged["trends"].items():
        if what == "counts":
            continue
        n = len(roles[what]) if what in roles else "whole run"
        rows.append([what, n, _cell(t["threads"]), _cell(t["rss_kb"], 1024, " MB"),
                     _cell(t["fds"])])  # fmt: skip
    table = harness.markdown_table(["process", "lives", "threads", "RSS", "open fds"], rows)
    counts = judged["trends"]["counts"]
    status = result["status"]
    verdict = "PASS: flat" if judged["passed"] else "FAIL: " + "; ".join(judged["problems"])
    return (
        f"{result['nodes']} nodes x {result['tasks_per_node']} tasks, {result['minutes']:g} min, "
        f"{len(result['kills_s'])} ranks killed (one every {result['every']:g} s), "
        f"SLURMTF_WARM_STANDBY={result['warm']}, {result['steps']} steps, "
        f"TensorFlow {result['tensorflow']}:\n\n{table}\n\n"
        f"Job processes {_cell(counts['processes'])}, files kept {_cell(counts['files'])} "
        f"(TensorBoard's event files besides: {_event_files(result)}), "
        f"temporary folder entries {_cell(counts['tmp'])}. slurmtf status: "
        f"{status['failures']} failures, {status['steps_redone']} steps redone, "
        f"{status['seconds_lost']} s lost, goodput {status['goodput']}.\n\n{verdict}\n"
        + _new("files", result.get("new_files", []))
        + _new("temporary folder entries", result.get("new_tmp", []))
    )


def _event_files(result: JSONDict) -> str:
    counted = [c["event_files"] for c in result["counts"] if "event_files" in c]
    if not counted:
        return "not counted"
    return f"{counted[0]} -> {counted[-1]}, one per summary writer and start of the chief"


def _new(what: str, names: Sequence[str]) -> str:
    shown = ", ".join(names[:20]) + (" ..." if len(names) > 20 else "")
    return f"\nNew {what} since the warm-up ({len(names)}): {shown}\n" if names else ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.soak_failures", description=__doc__.split("\n\n")[0]
    )
    defaults = Plan()
    for field in dataclasses.fields(Plan):
        kind = type(getattr(defaults, field.name))
        parser.add_argument(f"--{field.name}", type=kind, default=getattr(defaults, field.name))
    parser.add_argument("--out", type=Path, default=harness.REPO / "docs" / "benchmarks")
    parser.add_argument("--judge", type=Path, help="judge a soak's JSON again, run nothing")
    args = parser.parse_args(argv)
    if args.judge:
        result = json.loads(args.judge.read_text())
    else:
        plan = Plan(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Plan)})
        result = run(plan)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "soak-failures.json").write_text(json.dumps(result, indent=1) + "\n")
    judged = judge(result)
    print(markdown(result, judged))
    return 0 if judged["passed"] else 1


def run(plan: Plan) -> JSONDict:
    """:func:`soak` on a sandbox of its own, started and stopped here."""
    from slurmtf.sandbox import Sandbox

    with tempfile.TemporaryDirectory(prefix="soak-failures-") as tmp:
        sandbox = Sandbox(Path(tmp) / "sbx", nodes=plan.nodes)
        sandbox.up()
        try:
            return soak(sandbox, plan, Path(tmp) / "run")
        finally:
            sandbox.down()


if __name__ == "__main__":
    sys.exit(main())
