"""Width: one job of 16, 256 and 1,024 stand-in ranks on the sandbox, through the real job
script and supervisor.

For each shape, N nodes x T tasks (2 x 8, 16 x 16, 64 x 16), a sandbox of N + 1 nodes
with T CPUs each (every node its own network namespace, ``link="unshaped"``) runs
``sbatch -N(N+1) --ntasks-per-node=T jobs/train.sbatch benchmarks/standin.py`` with
``SPARE_NODES=1``: every rank is ``python -m slurmtf.run`` running the stand-in
(:mod:`benchmarks.standin`: events and heartbeats, no TensorFlow). Measured, in order:

* memory while every rank runs: the proportional set size (PSS) of the job's ranks, of
  its slurmstepds and srun, of its supervisor and of the sandbox's daemons, and
  ``MemAvailable`` before the sandbox and then;
* launch: seconds from ``sbatch`` to every rank's process running, and to the chief's
  first ``progress`` (every rank registered with it);
* the supervisor while every rank runs: its CPU seconds per minute
  (:func:`benchmarks.harness.cpu_seconds` over ``--window`` s), then the files it opens
  or stats under the job's log folder per look
  (``strace -f -e trace=openat,stat,lstat,newfstatat,statx,access`` for 15 s);
* ``slurmtf status JOB`` and ``slurmtf logs JOB`` (rank 0 and the last rank): wall time;
* a SIGKILLed rank: seconds to the step's end (its srun gone), to the supervisor's decision
  (the time in its record), to every rank of the next step running and to its chief's first
  ``progress``;
* a frozen node (``nodefaults.freeze_node``, the last training node): the same, and the
  spare that took its place;
* the job's end: its final state (COMPLETED).

``--repo DIR`` runs another checkout's job script and supervisor (its ranks' slurmtf too)
with this stand-in, to compare with an earlier version; ``--look_only`` stops after the
first attempt's figures (launch, memory, the supervisor's cost, status and logs).

    python -m benchmarks.bench_width [--quick] [--shapes 2x8,16x16,64x16] [--repo DIR]
        [--look_only]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import harness, protocol
from benchmarks.harness import JSONDict
from benchmarks.protocol import Benchmark, Options
from slurmtf.events import read_events
from slurmtf.runtime.recovery.record import read_record
from slurmtf.sandbox import Sandbox, nodefaults

SHAPES = ("2x8", "16x16", "64x16")  # training nodes x tasks: 16, 256 and 1,024 ranks
STANDIN = harness.REPO / "benchmarks" / "standin.py"
STRACE_S = 15.0
TRACED = "openat,open,stat,lstat,newfstatat,statx,access,faccessat,faccessat2"


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shapes",
        default=",".join(SHAPES),
        help="NODESxTASKS of the training step (default 2x8,16x16,64x16)",
    )
    parser.add_argument("--window", type=float, default=60.0, help="CPU window (s)")
    parser.add_argument("--repo", type=Path, default=harness.REPO,
                        help="the checkout whose job script and supervisor run")  # fmt: skip
    parser.add_argument(
        "--look_only",
        action="store_true",
        help="stop after the first attempt's figures (no kill, no freeze)",
    )


def mem_available_kb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


def pss_kb(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    found = re.search(r"^Pss:\s+(\d+)", text, re.MULTILINE)
    return int(found.group(1)) if found else 0


def memory(sandbox: Sandbox, job_id: str, ranks: int) -> JSONDict:
    """PSS (MB) of the job's ranks, its slurmstepds and srun, its supervisor, and the
    sandbox's daemons (slurmctld, every slurmd, munged), while every rank runs."""
    procs = harness.job_processes(job_id)
    rank = [p for k, pids in procs.items() if k.startswith("rank") for p in pids]

    def mb(pids: list[int]) -> float:
        return round(sum(pss_kb(p) for p in pids) / 1024, 1)

    steps = procs.get("stepd", []) + procs.get("other", [])
    out: JSONDict = {"ranks_mb": mb(rank), "stepd_srun_mb": mb(steps),
                     "supervisor_mb": mb(procs.get("batch", [])),
                     "daemons_mb": mb(list(sandbox.live_daemons().values()))}  # fmt: skip
    out["total_mb"] = round(sum(out.values()), 1)
    out["per_rank_mb"] = round(out["ranks_mb"] / max(ranks, 1), 2)
    out["available_mb"] = round(mem_available_kb() / 1024)
    return out


def ranks_up(job_id: str, ranks: int, old: set[int]) -> bool:
    """Every rank has a process that was not one of ``old`` (an earlier attempt's; a frozen
    node's stay until the node is mended)."""
    procs = harness.job_processes(job_id)
    return all(set(procs.get(f"rank{r}", [])) - old for r in range(ranks))


def supervisor_pid(job_id: str) -> int:
    return (harness.job_processes(job_id).get("batch") or [0])[0]


def cpu_per_minute(pid: int, window: float) -> float | None:
    before = harness.cpu_seconds(pid)
    time.sleep(window)
    after = harness.cpu_seconds(pid)
    if before is None or after is None:
        return None
    return round((after - before) * 60 / window, 3)


def trace_looks(pid: int, log_dir: Path, first_node: str, work: Path) -> JSONDict:
    """strace the supervisor for STRACE_S s: the path syscalls under ``log_dir`` per look
    (a look opens ``first_node``'s events file once; the earlier follower, its rank0.out)."""
    out = work / f"strace-{pid}.txt"
    tracer = subprocess.Popen(["strace", "-f", "-qq", "-e", f"trace={TRACED}", "-p", str(pid),
                               "-o", str(out)], stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(STRACE_S)
    tracer.send_signal(signal.SIGINT)
    tracer.wait(timeout=30)
    lines = [x for x in out.read_text(errors="replace").splitlines() if str(log_dir) in x]
    marker = re.compile(rf"/(events-\d+-{first_node}\.jsonl|rank0\.out)\"")
    looks = sum(1 for x in lines if "openat" in x and marker.search(x))
    names = sorted({Path(m.group(1)).name for x in lines if (m := re.search(r'"([^"]+)"', x))})
    return {"syscalls": len(lines), "looks": looks, "per_s": round(len(lines) / STRACE_S, 1),
            "per_look": round(len(lines) / looks, 1) if looks else None,
            "files": len(names), "names": names}  # fmt: skip


def timed(sandbox: Sandbox, args: list[str]) -> JSONDict:
    """A slurmtf command's wall time (the slowest of 3) and whether it exited 0."""
    times, codes = [], []
    for _ in range(3):
        started = time.monotonic()
        done = subprocess.run([harness.python(), "-m", "slurmtf", *args], env=sandbox.env(),
                              cwd=harness.REPO, capture_output=True, text=True, timeout=60,
                              check=False)  # fmt: skip
        times.append(time.monotonic() - started)
        codes.append(done.returncode)
    return {"s": round(max(times), 2), "exit": max(codes)}


def decisions(log_dir: Path, job_id: str) -> list[JSONDict]:
    """The supervisor's decisions so far (its record, :func:`read_record`)."""
    return read_record(log_dir, job_id)


def step_sruns(job_id: str) -> set[int]:
    """The job's training step's srun (not a probe: ``--overlap``), by PID."""
    found = set()
    for pid, argv, environ in harness.processes():
        own = f"SLURM_JOB_ID={job_id}".encode() in environ
        if own and argv and argv[0].endswith(b"srun") and b"--overlap" not in argv:
            found.add(pid)
    return found


def break_and_time(job: JobRun, what: str, act: Callable[[], object]) -> JSONDict:
    """Break the job (``act()``), then seconds to the step's end (its srun gone), to the
    next decision, to every rank of the next step running and to its chief's first
    ``progress`` (all registered again)."""
    old = set(harness.rank_pids(job.job_id).values())
    before = len(decisions(job.log_dir, job.job_id))
    srun = step_sruns(job.job_id)
    broken = time.time()
    act()
    step_end: float | None = None
    deadline = time.monotonic() + 300
    while len(decisions(job.log_dir, job.job_id)) <= before:
        if step_end is None and not srun & step_sruns(job.job_id):
            step_end = time.time()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no decision after the {what} within 300 s")
        time.sleep(0.1)
    record = decisions(job.log_dir, job.job_id)[before]
    harness.wait_until("every rank again", lambda: ranks_up(job.job_id, job.ranks, old), 600, 1)
    ranks_s = round(time.time() - broken, 1)
    job.attempt += 1
    harness.wait_until("training again", job.training, 600, 1)
    ended = round((step_end or record["time"]) - broken, 2)
    return {"action": record["action"], "to_step_end_s": ended,
            "to_decision_s": round(record["time"] - broken, 2), "to_ranks_s": ranks_s,
            "to_training_s": round(time.time() - broken, 1), "nodes": record.get("nodes"),
            "line": record.get("line")}  # fmt: skip


def parse_shape(text: str) -> tuple[int, int]:
    """``16x16`` -> (training nodes, tasks per node); at least 2 nodes: the one frozen is
    not the batch host (node1, where the supervisor runs)."""
    nodes, _, tasks = text.partition("x")
    if not (nodes.isdigit() and tasks.isdigit() and int(nodes) >= 2 and int(tasks) >= 1):
        raise ValueError(f"--shapes: {text!r} is not NODESxTASKS with NODES >= 2. HINT: 16x16")
    return int(nodes), int(tasks)


class JobRun:
    """One stand-in job on a sandbox: its id, logs and shape."""

    def __init__(self, sandbox: Sandbox, work: Path, shape: tuple[int, int], repo: Path,
                 seconds: float) -> None:  # fmt: skip
        nodes, per_node = shape
        self.sandbox, self.nodes, self.ranks = sandbox, nodes, nodes * per_node
        self.log_dir = work / "logs"
        env = {"LOG_DIR": str(self.log_dir), "MODEL_DIR": str(work / "model"),
               "SPARE_NODES": "1", "MAX_RESTARTS": "3", "PYTHON": harness.python(),
               "SLURMTF_REPO": str(repo), "PYTHONPATH": str(repo)}  # fmt: skip
        sbatch = [f"-N{nodes + 1}", f"--ntasks-per-node={per_node}", "--gres=none", "--time=60",
                  f"--output={work}/job.out"]  # fmt: skip
        args = [str(STANDIN), f"--seconds={seconds}", "--progress_s=5"]
        self.attempt = 0
        self.submitted = time.monotonic()
        script = str(repo / "jobs" / "train.sbatch")
        self.job_id = harness.submit_job(sandbox, [*sbatch, script, *args], env, cwd=repo)

    def training(self) -> bool:
        """The chief of this attempt or a later one (a restart the benchmark did not cause:
        its record says why) said ``progress``: every rank registered with it."""
        events = read_events(self.log_dir / "rank0.out")
        starts = [i for i, e in enumerate(events) if e.get("event") == "cluster"]
        if len(starts) <= self.attempt:
            return False
        self.attempt = len(starts) - 1
        return any(e.get("event") == "progress" for e in events[starts[-1] :])

    def tail(self) -> str:
        """The end of the job's log, to say why a wait timed out."""
        path = self.log_dir.parent / "job.out"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join(lines[-25:])


def measure(shape: tuple[int, int], work: Path, window: float, repo: Path,
            look_only: bool = False) -> JSONDict:  # fmt: skip
    """The whole run for one shape (see the module's docstring)."""
    nodes, per_node = shape
    free_before = mem_available_kb()
    # Every node its own network stack (link "unshaped", no cap): ports as on separate
    # machines, and no sandbox of another user on this host can hold a rank's port.
    sandbox = Sandbox(work / "sbx", nodes=nodes + 1, gpus_per_node=0, cpus_per_node=per_node,
                      link="unshaped")  # fmt: skip
    started = time.monotonic()
    sandbox.up(timeout=120)
    result: JSONDict = {"nodes": nodes, "per_node": per_node, "ranks": nodes * per_node,
                        "sandbox_up_s": round(time.monotonic() - started, 1)}  # fmt: skip
    note(result)
    job: JobRun | None = None
    stopped: list[int] = []
    try:
        job = JobRun(sandbox, work, shape, repo, seconds=window + STRACE_S + 60)
        result.update(attempt_zero(job, window, work))
        result["memory"]["available_before_mb"] = round(free_before / 1024)
        note(result)
        if not look_only:
            result.update(break_it(job, stopped))
            result["pass"] = passed(result)
        result["decisions"] = [r.get("line") for r in decisions(job.log_dir, job.job_id)]
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}\n{job.tail() if job else ''}") from exc
    finally:
        if job is not None:
            sandbox.run(["scancel", job.job_id], check=False)
        nodefaults.mend(sandbox, stopped, timeout=120)
        sandbox.down()
    return result


def break_it(job: JobRun, stopped: list[int]) -> JSONDict:
    """Kill a rank, then freeze the last training node (its PIDs to ``stopped``), then
    wait for the job's end."""
    out: JSONDict = {"killed": break_and_time(job, "kill", lambda: kill_rank(job))}
    note(out["killed"])
    frozen_node = f"node{job.nodes}"

    def freeze() -> None:
        stopped.extend(nodefaults.freeze_node(job.sandbox, frozen_node))

    out["frozen"] = {"node": frozen_node, **break_and_time(job, "freeze", freeze)}
    note(out["frozen"])
    harness.wait_until("the job's end", lambda: not harness.queued(job.sandbox, job.job_id),
                       900, 2)  # fmt: skip
    out["state"] = harness.job_state(job.sandbox, job.job_id)
    return out


def attempt_zero(job: JobRun, window: float, work: Path) -> JSONDict:
    """Launch, memory, the supervisor's cost, status and logs, while attempt 0 runs."""
    harness.wait_until("every rank", lambda: ranks_up(job.job_id, job.ranks, set()), 900, 1)
    out: JSONDict = {"launch_s": round(time.monotonic() - job.submitted, 1)}
    harness.wait_until("the chief's first progress", job.training, 300)
    out["registered_s"] = round(time.monotonic() - job.submitted, 1)
    out["memory"] = memory(job.sandbox, job.job_id, job.ranks)
    pid = supervisor_pid(job.job_id)
    out["supervisor_cpu_s_per_min"] = cpu_per_minute(pid, window)
    out["look"] = trace_looks(pid, job.log_dir, "node1", work)
    usage = harness.read_usage(pid)
    out["supervisor"] = {"threads": usage.threads, "fds": usage.fds,
                         "rss_kb": usage.rss_kb} if usage else None  # fmt: skip
    out["status"] = timed(job.sandbox, ["status", job.job_id])
    out["logs"] = timed(job.sandbox, ["logs", job.job_id])
    out["logs_last_rank"] = timed(job.sandbox, ["logs", job.job_id, f"--rank={job.ranks - 1}"])
    return out


def kill_rank(job: JobRun) -> None:
    """SIGKILL the middle rank's process."""
    os.kill(harness.rank_pids(job.job_id)[job.ranks // 2], signal.SIGKILL)


def passed(result: JSONDict) -> bool:
    """COMPLETED; the kill restarted in place; the frozen node's place taken by the spare;
    status and logs within 2 s."""
    spare = f"node{result['nodes'] + 1}"
    return bool(
        result.get("state") == "COMPLETED"
        and result["killed"]["action"] == "restart"
        and result["frozen"]["action"] == "restart"
        and spare in (result["frozen"].get("nodes") or [])
        and all(result[k]["s"] <= 2.0 and result[k]["exit"] == 0
                for k in ("status", "logs", "logs_last_rank"))
    )  # fmt: skip


def run(options: Options) -> JSONDict:
    text = "2x8" if options.quick else options.flag("shapes", ",".join(SHAPES))
    shapes = [parse_shape(t) for t in text.split(",")]
    window = 20.0 if options.quick else float(options.flag("window", 60.0))
    repo = Path(options.flag("repo", harness.REPO)).resolve()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-width-") as tmp:
        for nodes, per_node in shapes:
            work = Path(tmp) / f"{nodes}x{per_node}"
            look_only = bool(options.flag("look_only", False))
            results.append(measure((nodes, per_node), work, window, repo, look_only))
            note(results[-1])
    return {"results": results, "repo": str(repo)}


def note(result: JSONDict) -> None:
    """What was measured so far, on stderr (a 1,024-rank run takes many minutes)."""
    print(json.dumps(result), file=sys.stderr, flush=True)


COLUMNS: list[tuple[str, Callable[[JSONDict], object]]] = [
    ("ranks", lambda r: r["ranks"]),
    ("nodes", lambda r: f"{r['nodes']}+1 x {r['per_node']}"),
    ("memory MB (PSS)", lambda r: r["memory"]["total_mb"]),
    ("per rank MB", lambda r: r["memory"]["per_rank_mb"]),
    ("launch s", lambda r: r["launch_s"]),
    ("supervisor CPU s/min", lambda r: r["supervisor_cpu_s_per_min"]),
    ("opens+stats per look", lambda r: r["look"]["per_look"]),
    ("files", lambda r: r["look"]["files"]),
    ("status s", lambda r: r["status"]["s"]),
    ("logs s", lambda r: max(r["logs"]["s"], r["logs_last_rank"]["s"])),
    ("kill: step end s", lambda r: r.get("killed", {}).get("to_step_end_s")),
    ("kill: decision s", lambda r: r.get("killed", {}).get("to_decision_s")),
    ("kill: ranks again s", lambda r: r.get("killed", {}).get("to_ranks_s")),
    ("freeze: step end s", lambda r: r.get("frozen", {}).get("to_step_end_s")),
    ("freeze: decision s", lambda r: r.get("frozen", {}).get("to_decision_s")),
    ("freeze: ranks again s", lambda r: r.get("frozen", {}).get("to_ranks_s")),
    ("state", lambda r: r.get("state")),
    ("verdict", lambda r: None if r.get("pass") is None else "PASS" if r["pass"] else "FAIL"),
]


def markdown(result: JSONDict) -> str:
    rows = [[cell(r) for _, cell in COLUMNS] for r in result["results"]]
    return harness.markdown_table([name for name, _ in COLUMNS], rows)


BENCHMARK = protocol.declare(__name__, Benchmark(
    "width", "Width: 16 to 1,024 stand-in ranks through the supervisor", run, markdown,
    description=__doc__, arguments=_arguments,
))  # fmt: skip
