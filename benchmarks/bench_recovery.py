"""Time from a failure to the first step of the resumed training, and the steps lost.

One sandbox as a real cluster behaves (``cred_expire=120``: a requeued job waits 120 s
before it may start again; ``SlurmdTimeout=120``; nodes with namespaces of their own),
4 nodes; one ``jobs/mnist.sbatch`` run per case, broken at step 12 while another job waits
for our nodes (``slurmtf.sandbox.competitor``, 120 s, one node more than are free). Kinds:

* ``rank``: rank 1's Python process gets SIGKILL;
* ``hang``: rank 1's Python process gets SIGSTOP (a hung rank);
* ``spare``: rank 1's node freezes (``nodefaults.freeze_node``) in a 2+1-spare job;
* ``range``: rank 2's node freezes in a ``--nodes=2-3`` job (``MIN_NODES=2``).

Each kind runs on two paths side by side: ``in_place`` (what the job script does:
a new step in the same allocation, on a spare or the nodes left where a node is lost) and
``requeue`` (``SLURMTF_RESTART_IN_PLACE=0``: the same detection, then ``scontrol
requeue`` as every failure did before, the lost node in the job's ``ExcNodeList``).
Kept per run: seconds from the failure to rank 0's
first progress line after its next ``cluster`` event, the steps lost (last step logged
before the failure minus the step training resumed at), Slurm's restart count, and
whether the competing job was still pending when training resumed.

    python -m benchmarks.bench_recovery [--quick] [--kinds spare,range] [--paths in_place]
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
from slurmtf.sandbox import Sandbox, nodefaults
from slurmtf.sandbox.competitor import submit_competitor

KINDS = ("rank", "hang", "spare", "range")
PATHS = ("in_place", "requeue")
NODES = 4  # one more than a job holds: a requeued 3-node job finds 3 without the lost one
BREAK_AT = 12
ENDED = {"FAILED", "CANCELLED", "COMPLETED", "TIMEOUT", "NODE_FAIL"}
STEPS = 60
ARGS = [
    "--batch_size=12", "--eval_steps=1", "--num_threads=1", "--seed=7", "--log_every=1",
    f"--train_steps={STEPS}", "--checkpoint_every=5", "--heartbeat_timeout=10",
]  # fmt: skip


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kinds", default=",".join(KINDS), help="failure kinds to run")
    parser.add_argument("--paths", default=",".join(PATHS), help="in_place, requeue or both")


def rank_process(job_id: str, rank: int) -> tuple[int, str] | None:
    """(PID, node) of ``rank``'s process of ``job_id``, from /proc."""
    pid = harness.rank_pids(job_id).get(rank)
    if pid is None:
        return None
    node = harness.environ_of(pid).get(b"SLURMD_NODENAME", b"").decode()
    return pid, node


def submit(sandbox: Sandbox, kind: str, path: str, run: Path) -> str:
    shape = ["--nodes=2-3"] if kind == "range" else ["-N3" if kind == "spare" else "-N2"]
    env = {"MODEL_DIR": str(run / "model"), "LOG_DIR": str(run / "logs"), "MAX_RESTARTS": "2",
           "PYTHON": harness.python()}  # fmt: skip
    env.update({"spare": {"SPARE_NODES": "1"}, "range": {"MIN_NODES": "2"}}.get(kind, {}))
    if path == "requeue":  # every failure goes back to the queue
        env["SLURMTF_RESTART_IN_PLACE"] = "0"
    run.mkdir(parents=True, exist_ok=True)  # sbatch --output must have its folder
    sbatch = [*shape, "--time=30", f"--job-name=rec-{kind}-{path}", f"--output={run}/job.out"]
    return harness.submit_job(sandbox, [*sbatch, str(harness.REPO / "jobs" / "mnist.sbatch"),
                                        *ARGS], env)  # fmt: skip


def last_line(run: Path) -> str:
    """The job log's last ``slurmtf:`` or ``srun: error:`` line."""
    path = run / "job.out"
    text = path.read_text(errors="replace") if path.exists() else ""
    lines = [x for x in text.splitlines() if "slurmtf:" in x or "srun: error:" in x]
    return lines[-1] if lines else ""


def free_nodes(sandbox: Sandbox) -> int:
    return sum(state == "idle" for state in sandbox.node_states().values())


def break_it(sandbox: Sandbox, kind: str, job_id: str) -> list[int]:
    """Break the job the ``kind`` way; the PIDs stopped (to thaw afterwards)."""
    found = rank_process(job_id, 2 if kind == "range" else 1)
    if found is None:
        raise RuntimeError(f"no rank process of job {job_id}")
    pid, node = found
    if kind == "rank":
        os.kill(pid, signal.SIGKILL)
        return []
    if kind == "hang":
        os.kill(pid, signal.SIGSTOP)
        return [pid]
    return nodefaults.freeze_node(sandbox, node)


def mend(sandbox: Sandbox, stopped: list[int], job_id: str) -> None:
    """Cancel the job, thaw and kill what was stopped, and bring every node back."""
    sandbox.run(["scancel", job_id], check=False)
    nodefaults.mend(sandbox, stopped, timeout=120, states=frozenset({"idle"}))


def measure(sandbox: Sandbox, kind: str, path: str, work: Path) -> JSONDict:
    """One run: submit, break at step BREAK_AT with a competitor waiting, time the resume."""
    run = work / f"{kind}-{path}"
    out = run / "logs" / "rank0.out"  # rank 0's events
    job_id = submit(sandbox, kind, path, run)

    def started() -> bool:
        return harness.last_step(out) >= 1 or harness.job_state(sandbox, job_id) in ENDED

    harness.wait_until("step 1", started, 300)
    if harness.last_step(out) < 1:
        raise RuntimeError(f"job {job_id} ended before training: {run}/job.out")
    # Another job that needs at least one of our nodes: it can only start when we leave.
    rival = submit_competitor(sandbox, nodes=free_nodes(sandbox) + 1)
    stopped: list[int] = []
    try:
        harness.wait_until(f"step {BREAK_AT}", lambda: harness.last_step(out) >= BREAK_AT, 300)
        before = harness.last_step(out)
        stopped = break_it(sandbox, kind, job_id)
        broken = time.monotonic()
        state = ""

        def resumed_or_ended() -> bool:
            nonlocal state
            state = harness.job_state(sandbox, job_id)
            return harness.resumed_step(out) is not None or state in ENDED

        harness.wait_until("training again", resumed_or_ended, 600)
        seconds = time.monotonic() - broken
        pending = rival.state() == "PENDING"
        show = sandbox.run(["scontrol", "-o", "show", "job", job_id]).stdout
    finally:
        rival.cancel()
        mend(sandbox, stopped, job_id)
    resumed = harness.resumed_step(out)
    if resumed is None:  # the job ended without training again: say how, from its log
        return {"kind": kind, "path": path, "ended": state, "why": last_line(run),
                "seconds": None, "load": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip
    return {
        "kind": kind, "path": path, "seconds": round(seconds, 1),
        "steps_lost": max(0, before - resumed + 1), "failed_after_step": before,
        "resumed_at_step": resumed, "slurm_restarts": int(show.split("Restarts=")[1].split()[0]),
        "competitor_pending": pending, "load": [round(x, 2) for x in os.getloadavg()],
    }  # fmt: skip


def run(options: Options) -> JSONDict:
    kinds = (
        ["spare", "range"] if options.quick else options.flag("kinds", ",".join(KINDS)).split(",")
    )
    paths = options.flag("paths", ",".join(PATHS)).split(",")
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        sandbox = Sandbox(Path(tmp) / "sbx", nodes=NODES, link="unshaped", slurmd_timeout=120,
                          cred_expire=120)  # fmt: skip
        sandbox.up()
        try:
            results = []
            for kind in kinds:
                for path in paths:
                    results.append(measure(sandbox, kind, path, Path(tmp)))
                    print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        finally:
            sandbox.down()
    return {"results": results, "load_before": load_before}


def markdown(result: JSONDict) -> str:
    rows = [
        [r["kind"], r["path"], r["seconds"], r["steps_lost"], r["slurm_restarts"],
         "pending" if r["competitor_pending"] else "took the nodes", " ".join(map(str, r["load"]))]
        if r.get("seconds") is not None else
        [r["kind"], r["path"], f"never: job {r['ended']} ({r['why']})", "-", "-", "-",
         " ".join(map(str, r["load"]))]
        for r in result["results"]
    ]  # fmt: skip
    headers = ["failure", "path", "s to training again", "steps lost", "Slurm restarts",
               "competing job", "load after"]  # fmt: skip
    return harness.markdown_table(headers, rows)


BENCHMARK = protocol.declare(__name__, Benchmark(
    "recovery", "recovery: failure to training again, in place vs requeue", run, markdown,
    description=__doc__, arguments=_arguments,
))  # fmt: skip
