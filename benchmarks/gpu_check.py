"""``python -m benchmarks.gpu_check``: does slurmtf use a GPU cluster's GPUs right?

Run it from the repository root on a login node of the cluster (``sbatch`` on PATH),
with the CUDA build of TensorFlow installed (``pip install -e '.[gpu]'``)::

    python -m benchmarks.gpu_check --gpus_per_node=4 [--partition=gpu] \\
        [--sbatch_option=--account=proj] [--steps=100] [--batch_per_gpu=256]

It submits ``jobs/resnet.sbatch`` on 1 node and then on 2 nodes, each with
``--gres=gpu:G --ntasks-per-node=G`` (one worker per GPU): ResNet-50 on synthetic
ImageNet-size images, bf16 + XLA. From every rank's ``cluster`` event and the chief's
``progress`` events it checks, per job:

* the job completed and every rank started, in one cluster of N x G workers;
* TensorFlow found a GPU on every rank (a job whose ranks see none is cancelled at
  once and reported as ``no GPU found``: a CPU-only machine fails, never passes);
* NCCL collectives were chosen;
* one GPU per worker: one ``CUDA_VISIBLE_DEVICES`` entry each, never the same GPU twice
  on a node, one local replica each, as slurmtf planned;
* images/s (and per GPU) of the steady intervals.

It prints one PASS/FAIL line per check, the 2-node scaling, and exits 0 only when
every check passed (1 otherwise, 2 on a usage error). Outputs stay in ``--out``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmtf.contracts import is_final
from slurmtf.events import read_events
from slurmtf.slurm.scontrol import parse_records

REPO = Path(__file__).resolve().parents[1]
MODEL_FLAGS = ("--resnet_size=50", "--dtype=bf16", "--enable_xla", "--use_synthetic_data")
NO_GPU_HINT = (
    "HINT: run on GPU nodes with the CUDA build of TensorFlow (pip install -e '.[gpu]'), "
    "and ask Slurm for the GPUs (--gpus_per_node, --partition)"
)

Runner = Callable[[Sequence[str]], str]


@dataclass
class JobOutcome:
    """What one check job left: its state, every rank's cluster event, the chief's progress."""

    name: str
    nodes: int
    gpus_per_node: int
    state: str = ""
    job_id: str = ""
    clusters: dict[int, dict[str, Any]] = field(default_factory=dict)
    progress: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def images_per_sec(progress: Sequence[dict[str, Any]]) -> float | None:
    """Median examples/s of the progress intervals after the first (compile, warm-up)."""
    rates = [float(e["examples_per_sec"]) for e in progress if "examples_per_sec" in e]
    steady = rates[1:] or rates
    return statistics.median(steady) if steady else None


def _rank_text(rank: int, event: dict[str, Any]) -> str:
    host = str(event.get("workers", ["?"])[rank] if rank < len(event.get("workers", [])) else "?")
    where = host.rsplit(":", 1)[0]
    return f"rank {rank} ({where}, CUDA_VISIBLE_DEVICES={event.get('cuda_visible_devices')})"


def check_job(job: JobOutcome) -> list[Check]:
    """The checks of one job, in order (pure: from its recorded outcome)."""
    checks = [Check("job completed", job.state == "COMPLETED", f"state {job.state or '?'}")]
    missing = [r for r in range(job.ranks) if r not in job.clusters]
    wrong_size = [r for r, e in job.clusters.items() if e.get("num_workers") != job.ranks]
    started = not missing and not wrong_size
    detail = f"{len(job.clusters)} of {job.ranks} ranks reported"
    if missing:
        detail += f"; none from rank(s) {', '.join(map(str, missing[:8]))}"
    if wrong_size:
        detail += f"; rank {wrong_size[0]} sees another cluster size"
    checks.append(Check("all ranks started", started, detail))
    if not job.clusters:
        why = "no rank reported its GPUs (see the job's logs)"
        names = ("GPU found", "NCCL", "one GPU per worker", "images/s")
        return [*checks, *(Check(name, False, why) for name in names)]
    events = sorted(job.clusters.items())
    blind = [(r, e) for r, e in events if int(e.get("gpus", 0)) < 1]
    if blind:
        r, e = blind[0]
        text = (
            f"no GPU found: TensorFlow sees no GPU on {len(blind)} rank(s), "
            f"e.g. {_rank_text(r, e)}. {NO_GPU_HINT}"
        )
        checks.append(Check("GPU found", False, text))
    else:
        checks.append(
            Check("GPU found", True, f"every rank sees {events[0][1].get('gpus')} GPU(s)")
        )
    algs = sorted({str(e.get("collective")) for _, e in events})
    checks.append(Check("NCCL", algs == ["nccl"], f"collectives: {', '.join(algs)}"))
    checks.append(_one_gpu_per_worker(events))
    rate = images_per_sec(job.progress)
    if rate is None or rate <= 0:
        checks.append(Check("images/s", False, "the chief reported no training progress"))
    else:
        per_gpu = rate / job.ranks
        checks.append(Check("images/s", True, f"{rate:,.0f} images/s ({per_gpu:,.0f} per GPU)"))
    return checks


def _one_gpu_per_worker(events: list[tuple[int, dict[str, Any]]]) -> Check:
    problems: list[str] = []
    held: dict[str, dict[str, int]] = {}  # node -> GPU id -> rank
    for rank, event in events:
        visible = str(event.get("cuda_visible_devices") or "")
        ids = [x for x in visible.split(",") if x]
        replicas = (event.get("local_replicas"), event.get("planned_replicas"))
        if len(ids) != 1:
            problems.append(f"{_rank_text(rank, event)} holds {len(ids)} GPUs")
        if replicas != (1, 1):
            problems.append(f"rank {rank} runs {replicas[0]} replica(s), planned {replicas[1]}")
        node = _rank_text(rank, event).split("(", 1)[1].split(",", 1)[0]
        for gpu in ids:
            other = held.setdefault(node, {}).setdefault(gpu, rank)
            if other != rank:
                problems.append(f"ranks {other} and {rank} share GPU {gpu} on {node}")
    if problems:
        return Check("one GPU per worker", False, "; ".join(problems[:3]))
    return Check("one GPU per worker", True, f"{len(events)} workers, each on its own GPU")


def report(jobs: Sequence[JobOutcome]) -> tuple[str, bool]:
    """The printed report and whether every check passed."""
    lines, ok = [], True
    rates: dict[int, float] = {}
    for job in jobs:
        shape = f"{job.nodes} node(s) x {job.gpus_per_node} GPU(s)"
        lines.append(f"{job.name}: {shape}, job {job.job_id or '-'}")
        for check in check_job(job):
            ok = ok and check.ok
            lines.append(f"  {'PASS' if check.ok else 'FAIL'}  {check.name}: {check.detail}")
        rate = images_per_sec(job.progress)
        if rate and job.state == "COMPLETED":
            rates[job.nodes] = rate
    if 1 in rates and 2 in rates:
        lines.append(f"2-node scaling: {rates[2] / (2 * rates[1]):.0%} of 2x the 1-node images/s")
    lines.append("RESULT: PASS" if ok and jobs else "RESULT: FAIL")
    return "\n".join(lines), ok and bool(jobs)


def collect(job: JobOutcome, log_dir: Path) -> None:
    """Fill ``job`` from ``rank<N>.out`` files (first cluster event per rank)."""
    for rank in range(job.ranks):
        events = read_events(log_dir / f"rank{rank}.out")
        cluster = next((e for e in events if e["event"] == "cluster"), None)
        if cluster is not None:
            job.clusters[rank] = cluster
        if rank == 0:
            job.progress = [e for e in events if e["event"] == "progress"]


def default_runner(args: Sequence[str]) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0 and args[0] == "sbatch":
        raise RuntimeError(f"{' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def job_state(job_id: str, runner: Runner) -> str:
    """Slurm's state of a job (squeue, then scontrol for a finished one); '' when unknown."""
    state = runner(["squeue", "-h", "-j", job_id, "-o", "%T"]).strip()
    if state:
        return state.splitlines()[0]
    records = parse_records(runner(["scontrol", "-o", "show", "job", job_id]))
    return records[0].get("JobState", "") if records else ""


def run_job(
    job: JobOutcome, args: argparse.Namespace, work: Path, runner: Runner = default_runner
) -> JobOutcome:
    """Submit jobs/resnet.sbatch for ``job``; wait; cancel at once when a rank sees no GPU."""
    run_dir = work / job.name
    log_dir = run_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    g = job.gpus_per_node
    every = max(1, args.steps // 5)
    command = [
        "sbatch", "--parsable", f"--nodes={job.nodes}", f"--gres=gpu:{g}",
        f"--ntasks-per-node={g}", f"--job-name=gpu_check_{job.name}",
        f"--time={args.time}", f"--output={run_dir}/%x-%j.out", *args.sbatch_option,
        str(REPO / "jobs" / "resnet.sbatch"), *MODEL_FLAGS,
        f"--batch_size={args.batch_per_gpu * job.ranks}", f"--train_steps={args.steps}",
        f"--log_every={every}", "--eval_steps=1", "--epochs_between_evals=100000",
    ]  # fmt: skip
    if args.partition:
        command.insert(2, f"--partition={args.partition}")
    command.insert(2, f"--export=ALL,MODEL_DIR={run_dir / 'model'},LOG_DIR={log_dir}")
    job.job_id = runner(command).strip().split(";")[0]
    print(f"{job.name}: job {job.job_id} submitted; per-rank logs in {log_dir}", flush=True)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        job.state = job_state(job.job_id, runner)
        collect(job, log_dir)
        if any(int(e.get("gpus", 0)) < 1 for e in job.clusters.values()):
            runner(["scancel", job.job_id])
            job.state = "CANCELLED (a rank sees no GPU)"
            return job
        if is_final(job.state):
            time.sleep(2)  # the last lines reach the shared file system
            collect(job, log_dir)
            return job
        time.sleep(5)
    runner(["scancel", job.job_id])
    job.state = f"TIMEOUT of the check ({args.timeout:.0f} s)"
    return job


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check",
        description="Check slurmtf on GPU nodes: 1 node, then 2 nodes, one worker per GPU, "
        "NCCL, ResNet-50 bf16 + XLA images/s. Prints PASS/FAIL per check.",
    )
    parser.add_argument("--gpus_per_node", type=int, required=True, help="GPUs of each node")
    parser.add_argument("--nodes", default="1,2", help="node counts to check (default 1,2)")
    parser.add_argument("--partition", help="Slurm partition of the GPU nodes")
    parser.add_argument("--sbatch_option", action="append", default=[],
                        help="another sbatch option, e.g. --account=proj (repeatable)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=100, help="training steps per job")
    parser.add_argument("--batch_per_gpu", type=int, default=256, help="images per GPU per step")
    parser.add_argument("--time", default="00:30:00", help="time limit of each job")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait per job")
    parser.add_argument("--out", type=Path, help="work folder (default ./gpu_check-<time>)")
    return parser


def main(argv: Sequence[str] | None = None, runner: Runner = default_runner) -> int:
    args = _parser().parse_args(argv)
    try:
        counts = [int(n) for n in args.nodes.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or args.gpus_per_node < 1 or args.steps < 2:
        print(f"gpu_check: --nodes={args.nodes!r} --gpus_per_node={args.gpus_per_node} "
              f"--steps={args.steps}: need node counts >= 1, GPUs >= 1, steps >= 2. "
              "HINT: e.g. --gpus_per_node=4 --nodes=1,2", file=sys.stderr)  # fmt: skip
        return 2
    if runner is default_runner and shutil.which("sbatch") is None:
        print("gpu_check: sbatch is not on PATH: no Slurm cluster to check. FAIL: no GPU "
              "found. HINT: run it on a login node of the GPU cluster",
              file=sys.stderr)  # fmt: skip
        return 1
    work = (args.out or Path(f"gpu_check-{time.strftime('%Y%m%d-%H%M%S')}")).absolute()
    jobs = []
    for nodes in counts:
        job = JobOutcome(f"{nodes}node", nodes, args.gpus_per_node)
        jobs.append(run_job(job, args, work, runner))
        if job.state.startswith("CANCELLED (a rank sees no GPU"):
            break  # the next job would see none either
    text, ok = report(jobs)
    print(text)
    (work / "report.txt").write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
