"""Two-worker MNIST on every tested TensorFlow release: examples/s and the start.

For each release of ``slurmtf/tf/releases.py`` (``--releases`` picks some), its virtual
environment is built or reused (``scripts/tf-venv.sh``) and MNIST (synthetic data, global
batch 200: 100 per replica) runs as 2 worker processes of one fake Slurm step, each
pinned to its own core, with MultiWorkerMirroredStrategy over loopback (RING). Measured:
the seconds from starting the ranks to the chief's first finished step (``progress``
event of step 1: interpreter, TensorFlow import, joining the peers, building, tracing)
and the steady examples/s after step 10. ``repeats`` runs per release, releases
alternating; medians are reported, with each release's rate against the newest's.

    python -m benchmarks.bench_tf_releases [--quick] [--releases 2.15,2.21] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import harness, protocol
from benchmarks.harness import REPO, JSONDict
from benchmarks.protocol import Benchmark, Options
from slurmtf.cluster.ports import free_port_base
from slurmtf.events import named, parse_events
from slurmtf.local.step import start_rank
from slurmtf.tf import releases

BATCH = 200  # global: 100 per replica, the per-replica batch of docs/MODELS.md's table
SKIP = 10  # steps left out of the rate (tracing, the first all-reduces)
SLOWER = 0.8  # a release under 80 % of the newest's rate gets a note


def venv_python(version: str) -> str:
    """The interpreter of ``version``'s environment (built first when missing)."""
    done = subprocess.run(["bash", str(REPO / "scripts" / "tf-venv.sh"), version], cwd=REPO,
                          capture_output=True, text=True, check=True)  # fmt: skip
    return str(Path(done.stdout.strip().splitlines()[-1]) / "bin" / "python")


def one_run(python: str, steps: int, log_dir: Path) -> JSONDict:
    """Two ranks of MNIST with ``python``: seconds to the first step, steady examples/s."""
    port_base = free_port_base(2)
    argv = [python, "-m", "models.mnist", "--use_synthetic_data", f"--batch_size={BATCH}",
            f"--train_steps={steps}", "--log_every=1", "--eval_steps=1",
            "--epochs_between_evals=100000", "--num_threads=1"]  # fmt: skip
    log_dir.mkdir(parents=True, exist_ok=True)
    outs = [log_dir / f"rank{rank}.out" for rank in range(2)]
    cores = harness.cores()
    procs = []
    started = time.monotonic()
    first_step = None
    try:
        for rank in range(2):
            slurm = harness.fake_slurm_env(rank, 2, 700000 + port_base % 1000, port_base)
            pin = harness.pin_to([cores[rank % len(cores)]])
            errors = log_dir / f"rank{rank}.err"
            procs.append(start_rank(argv, harness.clean_env(slurm), outs[rank], errors, cwd=REPO,
                                    preexec_fn=pin))  # fmt: skip
        while any(p.poll() is None for p in procs):
            if first_step is None and '"event": "progress"' in outs[0].read_text(errors="replace"):
                first_step = time.monotonic() - started
            if time.monotonic() - started > 1800:
                raise TimeoutError(f"{python}: 2-worker MNIST still running after 30 min")
            time.sleep(0.1)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if any(p.returncode != 0 for p in procs):
        err = (log_dir / "rank0.err").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{python}: exit {[p.returncode for p in procs]}\n{err}")
    progress = named(parse_events(outs[0].read_text()), "progress")
    steady = [e for e in progress if int(e["step"]) > SKIP]
    seconds = sum(BATCH / float(e["examples_per_sec"]) for e in steady)
    return {"first_step_s": first_step, "examples_per_s": len(steady) * BATCH / seconds}


def run(options: Options) -> JSONDict:
    chosen = options.flag("releases", "") or ",".join(r.tensorflow for r in releases.RELEASES)
    wanted = [releases.release(v.strip()) for v in chosen.split(",") if v.strip()]
    repeats = 1 if options.quick else int(options.flag("repeats", 3))
    steps = 30 if options.quick else 80
    log_root = options.log_dir or Path(tempfile.mkdtemp(prefix="bench-tf-releases-"))
    pythons = {r.tensorflow: venv_python(r.tensorflow) for r in wanted}
    samples: dict[str, list[JSONDict]] = {r.tensorflow: [] for r in wanted}
    for repeat in range(repeats):  # releases alternate: a busy minute hits all alike
        for release in wanted:
            where = log_root / f"{release.tensorflow}-{repeat}"
            samples[release.tensorflow].append(one_run(pythons[release.tensorflow], steps, where))
    rows: list[JSONDict] = [
        {
            "tensorflow": r.tensorflow,
            "keras": r.keras,
            "examples_per_s": harness.median([s["examples_per_s"] for s in samples[r.tensorflow]]),
            "first_step_s": harness.median([s["first_step_s"] for s in samples[r.tensorflow]]),
            "samples": samples[r.tensorflow],
        }
        for r in wanted
    ]
    newest = next((row for row in rows if row["tensorflow"] == releases.NEWEST.tensorflow), None)
    for row in rows:
        row["vs_newest"] = row["examples_per_s"] / newest["examples_per_s"] if newest else None
    return {"name": "tf_releases", "batch": BATCH, "steps": steps, "repeats": repeats,
            "load": os.getloadavg()[0], "releases": rows}  # fmt: skip


def markdown(result: JSONDict) -> str:
    def ratio(row: dict[str, Any]) -> str:
        value = row.get("vs_newest")
        if value is None:
            return ""
        return f"{value:.2f}" + (" (slower)" if value < SLOWER else "")

    table = [[r["tensorflow"], r["keras"], r["examples_per_s"], r["first_step_s"], ratio(r)]
             for r in result["releases"]]  # fmt: skip
    headers = ["TensorFlow", "Keras", "examples/s (2 workers)", "start to first step (s)",
               "rate / 2.21's"]  # fmt: skip
    return harness.markdown_table(headers, table)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--releases", default="", help="comma-separated (default: all tested)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per release")


BENCHMARK = protocol.declare(__name__, Benchmark(
    "tf_releases", "Two-worker MNIST on every tested TensorFlow release", run, markdown,
    description=__doc__, arguments=_arguments,
))  # fmt: skip
