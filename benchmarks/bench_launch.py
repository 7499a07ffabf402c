"""Launch overhead on the local Slurm sandbox: sbatch -> first training step of 2-node MNIST.

A 2-node sandbox (``slurmtf.sandbox``) is started in a private directory and stopped at
the end. In the same run, on the same two nodes, alternating, ``repeats`` times:

* **bare**: ``sbatch -N2 --wrap "srun python -c 'import tensorflow; print(...)'"``: the
  time from calling sbatch until both tasks have imported TensorFlow;
* **mnist**: ``sbatch jobs/mnist.sbatch --log_every=1 ...`` (the job script users run):
  the time until rank 0 has printed its ``cluster`` event (resolver + strategy + peers
  connected) and then its first ``step 1/`` progress line.
* **end**: the same MNIST job left to finish (checkpoint and SavedModel export on the
  chief): the time from rank 0's last training step and from rank 0's last log line (its
  files' last write) to the job leaving the queue, and the export's own duration (the
  chief's ``Exported SavedModel ... in S s`` line), measured apart since it falls inside.

Both are timed the same way: this process polls the tasks' output files every 20 ms
(accurate to about that). The difference mnist - bare is what slurmtf (resolver,
strategy set-up, rendezvous, input pipeline, model build, first traced step) adds to a
bare TensorFlow start. A first warm-up job (Slurm's first scheduling pass) is not timed.
A job is cancelled once its milestone is seen. Both nodes share this machine's cores.

    python -m benchmarks.bench_launch [--quick]
"""

from __future__ import annotations

import re
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import harness, protocol
from benchmarks.harness import JSONDict
from benchmarks.protocol import Benchmark, Options, figure
from slurmtf.sandbox import Sandbox

POLL_S = 0.02
MNIST_FLAGS = (
    "--use_synthetic_data",
    "--batch_size=64",
    "--train_steps=5",
    "--log_every=1",
    "--epochs_between_evals=100000",
    "--eval_steps=1",
)


def _scancel(sandbox: Sandbox, job: str) -> None:
    sandbox.run(["scancel", job], timeout=30, check=False)
    harness.wait_until(f"job {job} gone", lambda: not harness.queued(sandbox, job), 60, POLL_S)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def wait_for(
    checks: dict[str, Any], start: float, timeout: float, alive: Any = None, why: Any = None
) -> dict[str, float]:
    """Poll until every check (a no-argument callable) is true; seconds since ``start``.

    ``alive`` (checked about once a second) returning false means the job ended first.
    """
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    next_alive = time.monotonic() + 1.0
    while len(seen) < len(checks):
        now = time.monotonic()
        for name, check in checks.items():
            if name not in seen and check():
                seen[name] = now - start
        missing = sorted(set(checks) - set(seen))
        if missing and now > deadline:
            raise TimeoutError(f"not seen within {timeout:.0f} s: {missing}")
        if missing and alive is not None and now > next_alive:
            next_alive = now + 1.0
            if not alive() and not all(checks[m]() for m in missing):
                raise RuntimeError(f"job ended before {missing}: {why() if why else ''}")
        time.sleep(POLL_S)
    return seen


def bare_job(sandbox: Sandbox, env: dict[str, str], work: Path, tag: str) -> JSONDict:
    out = work / f"bare-{tag}"
    out.mkdir()
    code = "import tensorflow; print('imported', flush=True)"
    wrap = (
        f"srun --output={shlex.quote(str(out))}/rank%t.out "
        f"{shlex.quote(harness.python())} -c {shlex.quote(code)}"
    )
    start = time.monotonic()
    job = harness.submit_job(
        sandbox,
        ["-N2", "--ntasks-per-node=1", "--gres=gpu:1", f"--output={out}/job.out", "--wrap", wrap],
        base=env,
    )
    try:
        seen = wait_for(
            {f"rank{r}": (lambda p=out / f"rank{r}.out": "imported" in _read(p)) for r in range(2)},
            start,
            timeout=600,
            alive=lambda: harness.queued(sandbox, job),
            why=lambda: _read(out / "job.out")[-2000:],
        )
    finally:
        _scancel(sandbox, job)
    return {"job": job, "import_s": max(seen.values()), **seen}


def mnist_job(sandbox: Sandbox, env: dict[str, str], work: Path, tag: str) -> JSONDict:
    out = work / f"mnist-{tag}"
    logs = out / "logs"
    out.mkdir()
    job_env = {"LOG_DIR": str(logs), "MODEL_DIR": str(out / "model")}
    start = time.monotonic()
    script = str(harness.REPO / "jobs" / "mnist.sbatch")
    job = harness.submit_job(
        sandbox, ["-N2", f"--output={out}/job.out", script, *MNIST_FLAGS], job_env, base=env
    )
    try:
        seen = wait_for(
            {
                "cluster_s": lambda: '"event": "cluster"' in _read(logs / "rank0.out"),
                "first_step_s": lambda: bool(harness.progress_events(_read(logs / "rank0.out"))),
            },
            start,
            timeout=600,
            alive=lambda: harness.queued(sandbox, job),
            why=lambda: (_read(out / "job.out") + _read(logs / "rank0.err"))[-2000:],
        )
    finally:
        _scancel(sandbox, job)
    return {"job": job, **seen}


def end_job(sandbox: Sandbox, env: dict[str, str], work: Path, tag: str) -> JSONDict:
    """A finishing MNIST job: last step, rank 0's last line and export vs. the job's end."""
    out = work / f"end-{tag}"
    logs = out / "logs"
    out.mkdir()
    job_env = {"LOG_DIR": str(logs), "MODEL_DIR": str(out / "model")}
    script = str(harness.REPO / "jobs" / "mnist.sbatch")
    job = harness.submit_job(
        sandbox, ["-N2", f"--output={out}/job.out", script, *MNIST_FLAGS], job_env, base=env
    )
    last_step = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        steps = harness.progress_events(_read(logs / "rank0.out"))
        if last_step is None and steps and steps[-1]["step"] == steps[-1]["total"]:
            last_step = time.time()
        if not harness.queued(sandbox, job):
            break
        time.sleep(POLL_S)
    else:
        _scancel(sandbox, job)
        raise TimeoutError(f"job {job} still queued after 600 s")
    ended = time.time()
    if last_step is None:
        why = _read(out / "job.out")[-2000:]
        raise RuntimeError(f"job {job} ended before its last step: {why}")
    rank0 = [logs / "rank0.out", logs / "rank0.err"]
    last_line = max(p.stat().st_mtime for p in rank0 if p.exists())
    text = "".join(_read(p) for p in logs.glob("rank*.err"))
    export = re.search(r"Exported SavedModel to \S+ in ([0-9.]+) s", text)
    return {
        "job": job,
        "last_step_to_end_s": ended - last_step,
        "teardown_s": ended - last_line,
        "export_s": float(export.group(1)) if export else None,
        "error_lines": len(re.findall(r"^E\d{4} ", text, re.MULTILINE)),
    }


def run(options: Options) -> JSONDict:
    quick, log_dir = options.quick, options.log_dir
    repeats = 1 if quick else 3
    keep = log_dir is not None
    work = Path(tempfile.mkdtemp(prefix="slurmtf-bench-launch-"))
    if keep and log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="launch-", dir=log_dir))
    sandbox = Sandbox(work / "sandbox", nodes=2, gpus_per_node=1)
    t0 = time.monotonic()
    sandbox.up()
    up_s = time.monotonic() - t0
    try:
        env = harness.clean_env({"PYTHON": harness.python(), "SLURMTF_REPO": str(harness.REPO)})
        warm = bare_job(sandbox, env, work, "warmup")
        bare: list[JSONDict] = []
        mnist: list[JSONDict] = []
        end: list[JSONDict] = []
        for i in range(repeats):
            order = ("bare", "mnist") if i % 2 == 0 else ("mnist", "bare")
            for kind in order:
                if kind == "bare":
                    bare.append(bare_job(sandbox, env, work, str(i)))
                else:
                    mnist.append(mnist_job(sandbox, env, work, str(i)))
            end.append(end_job(sandbox, env, work, str(i)))
    finally:
        t1 = time.monotonic()
        sandbox.down()
        down_s = time.monotonic() - t1
    bare_s = harness.median([b["import_s"] for b in bare])
    cluster_s = harness.median([m["cluster_s"] for m in mnist])
    first_s = harness.median([m["first_step_s"] for m in mnist])
    return {
        "name": "launch",
        "repeats": repeats,
        "sandbox_up_s": up_s,
        "sandbox_down_s": down_s,
        "warmup_job_s": warm["import_s"],
        "bare": bare,
        "mnist": mnist,
        "end": end,
        "median": {
            "teardown_s": harness.median([e["teardown_s"] for e in end]),
            "last_step_to_end_s": harness.median([e["last_step_to_end_s"] for e in end]),
            "bare_import_s": bare_s,
            "mnist_cluster_s": cluster_s,
            "mnist_first_step_s": first_s,
            "overhead_s": first_s - bare_s,
        },
        "mnist_flags": list(MNIST_FLAGS),
    }


def markdown(result: JSONDict) -> str:
    med = result["median"]
    rows = [
        ["sbatch -> `import tensorflow` done on both nodes (bare srun)", med["bare_import_s"]],
        ["sbatch -> MNIST rank 0 `cluster` event (resolver, strategy, peers)",
         med["mnist_cluster_s"]],
        ["sbatch -> MNIST first training step", med["mnist_first_step_s"]],
        ["**overhead: first step - bare import**", med["overhead_s"]],
        ["MNIST last step -> job ended (checkpoint, export, teardown)",
         med.get("last_step_to_end_s", "-")],
        ["**teardown: rank 0's last line -> job ended**", med.get("teardown_s", "-")],
        ["sandbox up (2 nodes) / down", f"{result['sandbox_up_s']:.1f} / "
         f"{result['sandbox_down_s']:.1f}"],
    ]  # fmt: skip
    text = harness.markdown_table([f"median of {result['repeats']} (seconds)", "seconds"], rows)
    each = [
        [i + 1, b["import_s"], m["cluster_s"], m["first_step_s"]]
        for i, (b, m) in enumerate(zip(result["bare"], result["mnist"], strict=True))
    ]
    text += "\n" + harness.markdown_table(
        ["repeat", "bare import (s)", "MNIST cluster (s)", "MNIST first step (s)"], each
    )
    ends = [
        [i + 1, e["last_step_to_end_s"], e["teardown_s"],
         "-" if e["export_s"] is None else e["export_s"], e["error_lines"]]
        for i, e in enumerate(result.get("end", []))
    ]  # fmt: skip
    if ends:
        text += "\n" + harness.markdown_table(
            ["repeat", "last step -> end (s)", "teardown (s)", "export (s)", "E lines"], ends
        )
    return text


def plot(result: JSONDict, out_dir: Path) -> list[Path]:
    med = result["median"]
    path = out_dir / "launch.png"
    with figure(path, size=(6.4, 2.8)) as ax:
        ax.barh(["bare srun\nimport tensorflow"], [med["bare_import_s"]], color="C0")
        ax.barh(["MNIST via\njobs/mnist.sbatch"], [med["mnist_cluster_s"]], color="C1",
                label="sbatch -> cluster event")  # fmt: skip
        rest = med["mnist_first_step_s"] - med["mnist_cluster_s"]
        ax.barh(["MNIST via\njobs/mnist.sbatch"], [rest], left=[med["mnist_cluster_s"]],
                color="C2", label="cluster event -> first step")  # fmt: skip
        ax.set_xlabel("seconds after sbatch (median)")
        ax.set_title("Launch overhead on the 2-node sandbox")
        ax.legend(fontsize=8, loc="lower right")
    return [path]


BENCHMARK = protocol.declare(__name__, Benchmark(
    "launch", "Launch overhead (sandbox, 2 nodes)", run, markdown, plot,
    description=__doc__,
))  # fmt: skip
