"""One tracker run per job, through a killed rank and a requeue.

A real MLflow tracking server (sqlite backend) runs on 127.0.0.1 for the module, started
and stopped (by its process group) by the fixture. ``sbatch jobs/train.sbatch
tests/scripts/tracked.py`` runs a user's script on 2 nodes whose every rank calls
``mlflow.start_run()`` and ``wandb.init()`` (W&B offline) and logs a metric per step. Rank
1 is SIGKILLed (a restart in place), then the job is requeued with ``scontrol requeue``:
three starts, each resuming from a checkpoint behind the last logged step. The server
then has one run, tagged with the job's id and named after the job, whose metric has
every step once; the chief's W&B runs all have the job's id; the other rank's
``start_run()`` went to its throwaway store.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurmtf.cluster.ports import free_port_base
from slurmtf.events import named, read_events
from tests.e2e.conftest import REPO, SlurmSandbox
from tests.e2e.jobruns import SandboxJob, rank_pids, wait_until
from tests.prereqs import require

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SCRIPT = REPO / "tests" / "scripts" / "tracked.py"
STEPS, EVERY = 40, 10  # steps of 0.5 s, a checkpoint every 10
EXPERIMENT = "slurmtf-e2e"


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``mlflow server`` on a free port of 127.0.0.1; its URI. Stopped by its group id."""
    for name in ("mlflow", "wandb"):
        require(importlib.util.find_spec(name) is not None, f"{name} (pip install .[dev])")
    folder = tmp_path_factory.mktemp("mlflow")
    port = free_port_base(1)
    command = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
        "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
        "--default-artifact-root", str(folder / "artifacts"), "--workers", "1",
    ]  # fmt: skip
    log = (folder / "server.log").open("w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240  # the first start makes the database's tables
        while not answers(f"{uri}/health"):
            assert server.poll() is None, (folder / "server.log").read_text()
            assert time.monotonic() < deadline, (folder / "server.log").read_text()
            time.sleep(1)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(10)  # it may not stop on SIGTERM alone
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def progress(job: SandboxJob) -> list[dict[str, Any]]:
    path = job.log_dir / "rank0.out"
    return named(read_events(path), "progress") if path.exists() else []


def starts(job: SandboxJob, rank: int = 0) -> list[dict[str, Any]]:
    path = job.log_dir / f"rank{rank}.out"
    return named(read_events(path), "cluster") if path.exists() else []


def reached(job: SandboxJob, step: int, start: int) -> bool:
    """Rank 0's ``start``-th start (0: the first) has logged ``step``."""
    events = read_events(job.log_dir / "rank0.out") if (job.log_dir / "rank0.out").exists() else []
    seen = -1
    for event in events:
        seen += event.get("event") == "cluster"
        if seen == start and event.get("event") == "progress" and event["step"] >= step:
            return True
    return False


def test_one_run_per_job_through_a_restart_and_a_requeue(
    slurm_sandbox: SlurmSandbox, mlflow_server: str, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    job = SandboxJob(slurm_sandbox, tmp_path / "tracked", timeout=600)
    (tmp_path / "tmp").mkdir()
    env = {
        "MLFLOW_TRACKING_URI": mlflow_server, "MLFLOW_EXPERIMENT_NAME": EXPERIMENT,
        "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
        "TMPDIR": str(tmp_path / "tmp"), "MAX_RESTARTS": "3", "PYTHON": sys.executable,
    }  # fmt: skip
    args = [str(SCRIPT), f"--model_dir={job.model_dir}", f"--steps={STEPS}",
            f"--checkpoint_every={EVERY}"]  # fmt: skip
    job.model_dir.mkdir(parents=True)
    try:
        job.submit(args, script="train.sbatch", env=env)
        wait_until(job, lambda: reached(job, EVERY + 3, 0), 400, f"step {EVERY + 3}")
        pids = rank_pids(job.job_id, 1, str(SCRIPT))
        assert pids, job.report()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        wait_until(job, lambda: reached(job, 2 * EVERY + 4, 1), 400, "the restart's progress")
        slurm_sandbox.run(["scontrol", "requeue", job.job_id])
        assert job.wait(600) == "COMPLETED", job.report()
    finally:
        job.cancel()

    chief = starts(job)
    print("MEASURED starts", [(s["start_step"], s["last_logged"]) for s in chief])
    assert len(chief) == 3, job.report()
    assert {s["mlflow_run"] for s in chief} == {chief[0]["mlflow_run"]}, chief
    steps = [p["step"] for p in progress(job)]
    redone = [s for s in steps if steps.count(s) > 1]
    assert redone, f"no step was taken twice: the test shows nothing\n{steps}"

    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    (run,) = runs
    assert run.data.tags["slurmtf.job"] == job.job_id
    assert run.info.run_name == f"{job.run_dir.name}-{job.job_id}"
    assert run.info.run_id == chief[0]["mlflow_run"]
    history = sorted(m.step for m in client.get_metric_history(run.info.run_id, "step"))
    assert history == list(range(1, STEPS + 1)), history

    offline = sorted(p.name for p in (tmp_path / "wandb").glob("offline-run-*"))
    assert len(offline) == 3, offline
    assert all(name.endswith(f"-slurm-{job.job_id}") for name in offline), offline
    assert {s["wandb_run"] for s in chief} == {f"slurm-{job.job_id}"}
    other = starts(job, 1)
    assert other, job.report()
    assert {s["mlflow_run"] for s in other}.isdisjoint({run.info.run_id})
    assert (tmp_path / "tmp" / f"slurmtf-mlruns-{job.job_id}-rank1").is_dir()
