"""End-to-end: jobs/mnist.sbatch and jobs/resnet.sbatch trained across sandbox nodes.

The three jobs are submitted together (they fit side by side on the 3-node sandbox)
and each test then checks one of them from its outputs: every rank's JSON event lines
(``cluster``, ``eval``, ``done``), the job log and the model directory.
"""

from __future__ import annotations

import importlib.util
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import REPO, TERMINAL, SlurmSandbox
from tests.prereqs import require

pytestmark = [pytest.mark.slurm, pytest.mark.tf]

JOB_TIMEOUT_S = 400  # three TensorFlow jobs share 2 cores
TINY = [
    "--train_steps=30",
    "--batch_size=32",
    "--eval_steps=2",
    "--log_every=10",
    "--num_threads=1",
]
TINY_RESNET = ["--resnet_size=20", "--train_steps=16", "--batch_size=32", "--eval_steps=1",
               "--log_every=8", "--num_threads=1"]  # fmt: skip


@dataclass
class JobRun:
    """One submitted training job and where its outputs go."""

    sandbox: SlurmSandbox
    job_id: str
    run_dir: Path
    nodes: int
    tasks: int
    state: str = ""
    events: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def model_dir(self) -> Path:
        return self.run_dir / "model"

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    def finish(self) -> str:
        if not self.state:
            self.state = self.sandbox.wait(self.job_id, JOB_TIMEOUT_S)
            for path in sorted(self.log_dir.glob("rank*.out")):
                rank = int(path.stem.removeprefix("rank"))
                self.events[rank] = [
                    json.loads(line)
                    for line in path.read_text().splitlines()
                    if line.startswith("{")
                ]
        return self.state

    def report(self) -> str:
        parts = [f"job {self.job_id} state {self.state!r}, run dir {self.run_dir}"]
        for path in [*self.run_dir.glob("*.out"), *sorted(self.log_dir.glob("rank*"))]:
            lines = path.read_text(errors="replace").splitlines()[-25:]
            parts.append(f"--- {path}:\n" + "\n".join(lines))
        parts.append(self.sandbox.logs(self.job_id))
        return "\n".join(parts)

    def of(self, event: str) -> dict[int, list[dict[str, Any]]]:
        return {r: [e for e in evs if e.get("event") == event] for r, evs in self.events.items()}


def _submit(
    sandbox: SlurmSandbox, root: Path, name: str, *, script: str, nodes: int, args: list[str]
) -> JobRun:
    run_dir = root / name
    run_dir.mkdir()
    env = {"MODEL_DIR": str(run_dir / "model"), "LOG_DIR": str(run_dir / "logs")}
    job_id = sandbox.submit(
        REPO / "jobs" / script, *args,
        sbatch_args=[f"-N{nodes}", f"--job-name={name}", f"--output={run_dir}/%x-%j.out"],
        env=env,
    )  # fmt: skip
    return JobRun(sandbox, job_id, run_dir, nodes=nodes, tasks=nodes)


@pytest.fixture(scope="module")
def training_jobs(
    slurm_sandbox: SlurmSandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, JobRun]]:
    require(importlib.util.find_spec("tensorflow") is not None, "TensorFlow (pip install .[cpu])")
    root = tmp_path_factory.mktemp("jobs")
    runs = {
        "mnist2": _submit(slurm_sandbox, root, "mnist2", script="mnist.sbatch", nodes=2, args=TINY),
        "mnist1": _submit(slurm_sandbox, root, "mnist1", script="mnist.sbatch", nodes=1, args=TINY),
        "resnet2": _submit(
            slurm_sandbox, root, "resnet2", script="resnet.sbatch", nodes=2, args=TINY_RESNET
        ),
    }
    yield runs
    for run in runs.values():
        if not run.state:
            slurm_sandbox.run(["scancel", run.job_id], check=False)


def check_training(run: JobRun) -> None:
    """Ranks formed one cluster, the loss fell, weights agree, only the chief wrote."""
    assert run.finish() == "COMPLETED", run.report()
    ranks = list(range(run.tasks))
    assert sorted(run.events) == ranks, run.report()

    clusters = run.of("cluster")
    workers = {tuple(clusters[r][0]["workers"]) for r in ranks}
    assert len(workers) == 1, f"ranks disagree on the worker list: {workers}\n{run.report()}"
    (worker_list,) = workers
    assert len(worker_list) == run.tasks
    if run.tasks > 1:  # a one-task step is a single local worker (resolver contract)
        hosts = {w.rsplit(":", 1)[0] for w in worker_list}
        assert hosts <= {f"node{i}" for i in range(1, 4)}, worker_list
        assert len(hosts) == run.nodes, worker_list
    for r in ranks:
        (cluster,) = clusters[r]
        assert cluster["rank"] == r
        assert cluster["num_workers"] == run.tasks

    done = run.of("done")
    finals = [done[r][-1] for r in ranks]
    for r, final in zip(ranks, finals, strict=True):
        assert final["rank"] == r
        assert final["first_loss"] > final["last_loss"], f"loss did not fall: {final}"
        assert final["preempted"] is False
    sums = [f["weights_checksum"] for f in finals]
    assert all(math.isclose(s, sums[0], rel_tol=1e-9, abs_tol=1e-9) for s in sums), (
        f"ranks ended with different weights: {sums}\n{run.report()}"
    )
    evals = run.of("eval")
    assert evals[0], "the chief printed no eval event"
    assert all(not evals[r] for r in ranks[1:]), "a non-chief rank printed eval events"

    # Only the chief writes: one checkpoint series, one summary writer, one SavedModel.
    ckpt = run.model_dir / "checkpoints"
    assert (ckpt / "checkpoint").is_file(), run.report()
    assert list(ckpt.glob("ckpt-*.index")), run.report()
    assert (run.model_dir / "export" / "saved_model.pb").is_file(), run.report()
    for summaries in ("train", "eval"):
        files = list((run.model_dir / summaries).glob("events.out.tfevents.*"))
        assert len(files) <= 1, f"more than one writer in {summaries}: {files}"
    known = {"checkpoints", "export", "train", "eval", "logs"}
    unexpected = [
        p.relative_to(run.model_dir)
        for p in run.model_dir.rglob("*")
        if p.is_file() and p.relative_to(run.model_dir).parts[0] not in known
    ]
    assert unexpected == [], f"files no chief writes: {unexpected}"
    job_log = next(run.run_dir.glob("*.out")).read_text()
    assert "srun exited 0" in job_log, job_log


def test_mnist_two_nodes(training_jobs: dict[str, JobRun]) -> None:
    check_training(training_jobs["mnist2"])


def test_mnist_one_node_fallback(training_jobs: dict[str, JobRun]) -> None:
    run = training_jobs["mnist1"]
    check_training(run)
    assert run.of("cluster")[0][0]["num_workers"] == 1


def test_resnet_two_nodes(training_jobs: dict[str, JobRun]) -> None:
    check_training(training_jobs["resnet2"])


def test_preempted_job_requeues_and_resumes(
    slurm_sandbox: SlurmSandbox, training_jobs: dict[str, JobRun], tmp_path: Path
) -> None:
    """USR2 to every rank: the model saves and exits 75, the script requeues, run 2 resumes."""
    for run in training_jobs.values():  # run alone: the others would slow it down
        run.finish()
    steps = ["--train_steps=300", "--batch_size=32", "--eval_steps=2", "--log_every=5"]
    run = _submit(slurm_sandbox, tmp_path, "preempt", script="mnist.sbatch", nodes=2, args=steps)
    chief_log = run.log_dir / "rank0.err"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        text = chief_log.read_text(errors="replace") if chief_log.exists() else ""
        if " step 5/" in text or slurm_sandbox.state(run.job_id) in TERMINAL:
            break
        time.sleep(0.5)
    else:
        slurm_sandbox.run(["scancel", run.job_id], check=False)
        pytest.fail(f"training never reached step 5\n{run.report()}")
    slurm_sandbox.run(["scancel", "--signal=USR2", run.job_id])
    assert run.finish() == "COMPLETED", run.report()

    done = run.of("done")
    assert [d["restart_count"] for d in done[0]] == [0, 1], run.report()
    first, second = done[0]
    assert first["preempted"] is True
    assert second["preempted"] is False
    assert second["start_step"] == first["step"] > 0, run.report()
    assert second["step"] == 300
    job_log = next(run.run_dir.glob("*.out")).read_text()
    assert "requeueing job" in job_log, job_log
    assert f"job {run.job_id} restart 1" in job_log, job_log
