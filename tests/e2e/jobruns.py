"""Sandbox training jobs shared by the end-to-end tests: submit, collect events, check.

``submit_job`` sends ``jobs/<script>`` with sbatch; ``JobRun.finish`` waits and reads
every rank's JSON event lines; ``check_training`` asserts what every healthy training job
shows (one cluster, falling loss, equal weights on every rank, chief-only outputs).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.conftest import REPO, SlurmSandbox


@dataclass
class JobRun:
    """One submitted training job and where its outputs go."""

    sandbox: SlurmSandbox
    job_id: str
    run_dir: Path
    nodes: int
    tasks: int
    timeout: float = 400.0  # several TensorFlow jobs share 2 cores
    model_path: Path | None = None  # default: run_dir/model
    logs_path: Path | None = None  # default: run_dir/logs
    state: str = ""
    events: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def model_dir(self) -> Path:
        return self.model_path or self.run_dir / "model"

    @property
    def log_dir(self) -> Path:
        return self.logs_path or self.run_dir / "logs"

    def finish(self) -> str:
        if not self.state:
            self.state = self.sandbox.wait(self.job_id, self.timeout)
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


def submit_job(
    sandbox: SlurmSandbox,
    root: Path,
    name: str,
    *,
    script: str,
    nodes: int,
    args: list[str],
    tasks_per_node: int = 1,
    sbatch_args: Sequence[str] = (),
    timeout: float = 400.0,
) -> JobRun:
    """``sbatch jobs/<script>`` on ``nodes`` nodes; outputs under ``root/name``."""
    run_dir = root / name
    run_dir.mkdir()
    env = {"MODEL_DIR": str(run_dir / "model"), "LOG_DIR": str(run_dir / "logs")}
    job_id = sandbox.submit(
        REPO / "jobs" / script, *args,
        sbatch_args=[
            f"-N{nodes}", f"--ntasks-per-node={tasks_per_node}", f"--job-name={name}",
            f"--output={run_dir}/%x-%j.out", *sbatch_args,
        ],
        env=env,
    )  # fmt: skip
    return JobRun(
        sandbox, job_id, run_dir, nodes=nodes, tasks=nodes * tasks_per_node, timeout=timeout
    )


def check_training(run: JobRun, *, loss_falls: bool = True) -> None:
    """Ranks formed one cluster, the loss fell, weights agree, only the chief wrote.

    ``loss_falls=False`` for runs too short to learn (a few steps of a ResNet, whose
    first steps at the full learning rate often raise the loss): the rest still holds.
    """
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
        assert hosts <= {f"node{i}" for i in range(1, run.sandbox.nodes + 1)}, worker_list
        assert len(hosts) == run.nodes, worker_list
    for r in ranks:
        (cluster,) = clusters[r]
        assert cluster["rank"] == r
        assert cluster["num_workers"] == run.tasks

    done = run.of("done")
    finals = [done[r][-1] for r in ranks]
    for r, final in zip(ranks, finals, strict=True):
        assert final["rank"] == r
        if loss_falls:
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
