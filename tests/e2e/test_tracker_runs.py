"""One tracker run per job, through a killed rank and a requeue.

A real MLflow tracking server (sqlite backend) runs on 127.0.0.1 for the module, started
and stopped (by its process group) by the fixture. ``sbatch jobs/train.sbatch
tests/scripts/tracked.py`` and ``slurmtf submit --command='python tests/scripts/tracked.py'``
run a user's script on 2 nodes whose every rank calls
``mlflow.start_run()`` and ``wandb.init()`` (W&B offline) and logs a metric per step. Rank
1 is SIGKILLed (a restart in place), then the job is requeued with ``scontrol requeue``:
three starts, each resuming from a checkpoint behind the last logged step. The server
then has one run, tagged with the job's id and named after the job, whose metric has
every step once; the chief's W&B runs all have the job's id; the other rank's
``start_run()`` went to its throwaway store.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slurmtf.cluster.ports import free_port_base
from slurmtf.events import named, read_events
from tests.e2e.conftest import PYTHON, REPO, TERMINAL, SlurmSandbox
from tests.e2e.jobruns import SandboxJob, rank_pids
from tests.prereqs import require

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SCRIPT = REPO / "tests" / "scripts" / "tracked.py"
STEPS, EVERY = 40, 10  # steps of 0.5 s, a checkpoint every 10


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``mlflow server`` on a free port of 127.0.0.1; its URI. Stopped, with the job
    consumers it starts, by its process group (its own: a new session)."""
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
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(10)  # it may not stop on SIGTERM alone
        with contextlib.suppress(ProcessLookupError):  # nor its job consumers (huey)
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        log.close()


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def events(out: Path, name: str) -> list[dict[str, Any]]:
    return named(read_events(out), name) if out.exists() else []


def reached(out: Path, step: int, start: int) -> bool:
    """Rank 0's ``start``-th start (0: the first) has logged ``step`` (its ``out`` file)."""
    seen = -1
    for event in read_events(out) if out.exists() else []:
        seen += event.get("event") == "cluster"
        if seen == start and event.get("event") == "progress" and event["step"] >= step:
            return True
    return False


def wait_for(predicate: Callable[[], bool], state: Callable[[], str], what: str) -> None:
    deadline = time.monotonic() + 400
    while not predicate():
        assert state() not in TERMINAL, f"the job ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within 400 s"
        time.sleep(0.3)


def tracker_env(uri: str, experiment: str, tmp_path: Path) -> dict[str, str]:
    (tmp_path / "tmp").mkdir()
    return {
        "MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": experiment,
        "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
        "TMPDIR": str(tmp_path / "tmp"),
    }  # fmt: skip


def interrupt(sandbox: SlurmSandbox, job_id: str, out: Path, state: Callable[[], str]) -> str:
    """SIGKILL rank 1 past the first checkpoint, ``scontrol requeue`` the job past the
    restart's next one (both redo steps); the job's final state."""
    wait_for(lambda: reached(out, EVERY + 3, 0), state, f"step {EVERY + 3}")
    pids = rank_pids(job_id, 1, str(SCRIPT))
    assert pids, sandbox.logs(job_id)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: reached(out, 2 * EVERY + 4, 1), state, "the restart's progress")
    sandbox.run(["scontrol", "requeue", job_id])
    return sandbox.wait(job_id, 600)


def the_job_run(uri: str, experiment: str, job_id: str) -> tuple[Any, Any]:
    """The client and the experiment's one run, which is tagged with the job's id."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    runs = client.search_runs([found.experiment_id])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    (run,) = runs
    assert run.data.tags["slurmtf.job"] == job_id
    return client, run


def check_one_run(uri: str, experiment: str, job_id: str, outs: list[Path], tmp: Path) -> str:
    """One MLflow run of the job (its name), every step once; the chief's W&B runs."""
    chief = events(outs[0], "cluster")
    print("MEASURED starts (resumed from, last logged)",
          [(s["start_step"], s["last_logged"]) for s in chief])  # fmt: skip
    assert len(chief) == 3, chief
    assert {s["mlflow_run"] for s in chief} == {chief[0]["mlflow_run"]}, chief
    steps = [p["step"] for p in events(outs[0], "progress")]
    assert [s for s in steps if steps.count(s) > 1], f"no step was redone: nothing shown\n{steps}"

    client, run = the_job_run(uri, experiment, job_id)
    assert run.info.run_id == chief[0]["mlflow_run"]
    history = sorted(m.step for m in client.get_metric_history(run.info.run_id, "step"))
    assert history == list(range(1, STEPS + 1)), history

    offline = sorted(p.name for p in (tmp / "wandb").glob("offline-run-*"))
    assert len(offline) == 3, offline
    assert all(name.endswith(f"-slurm-{job_id}") for name in offline), offline
    assert {s["wandb_run"] for s in chief} == {f"slurm-{job_id}"}
    other = events(outs[1], "cluster")
    assert len(other) == 3, other
    assert run.info.run_id not in {s["mlflow_run"] for s in other}
    assert (tmp / "tmp" / f"slurmtf-mlruns-{job_id}-rank1").is_dir()
    return str(run.info.run_name)


def test_a_job_script_keeps_one_run_through_a_restart_and_a_requeue(
    slurm_sandbox: SlurmSandbox, mlflow_server: str, tmp_path: Path
) -> None:
    job = SandboxJob(slurm_sandbox, tmp_path / "tracked", timeout=600)
    env = {**tracker_env(mlflow_server, "sbatch", tmp_path), "MAX_RESTARTS": "3",
           "PYTHON": sys.executable}  # fmt: skip
    args = [str(SCRIPT), f"--model_dir={job.model_dir}", f"--steps={STEPS}",
            f"--checkpoint_every={EVERY}"]  # fmt: skip
    try:
        job.submit(args, script="train.sbatch", env=env)
        out = job.log_dir / "rank0.out"
        assert interrupt(slurm_sandbox, job.job_id, out, job.state) == "COMPLETED", job.report()
    finally:
        job.cancel()
    outs = [job.log_dir / f"rank{r}.out" for r in (0, 1)]
    name = check_one_run(mlflow_server, "sbatch", job.job_id, outs, tmp_path)
    assert name == f"{job.run_dir.name}-{job.job_id}"


def test_a_submitted_command_keeps_one_run_through_a_restart_and_a_requeue(
    slurm_sandbox: SlurmSandbox, mlflow_server: str, tmp_path: Path
) -> None:
    command = (f"python3 {SCRIPT} --model_dir={tmp_path / 'model'} --steps={STEPS} "
               f"--checkpoint_every={EVERY}")  # fmt: skip
    done = slurm_sandbox.run(
        [PYTHON, "-m", "slurmtf.submit", "--nodes=2", "--time=10", "--max_restarts=3",
         f"--log_dir={tmp_path}", f"--command={command}"],
        env={**tracker_env(mlflow_server, "submit", tmp_path),
             "SLURMTF_PORT_BASE": str(free_port_base(2))},
        cwd=tmp_path, check=False,
    )  # fmt: skip
    found = re.search(r"submitted job (\d+)", done.stdout)
    assert found, done.stdout + done.stderr
    jid = found.group(1)
    try:
        out = tmp_path / f"{jid}_0_log.out"
        final = interrupt(slurm_sandbox, jid, out, lambda: slurm_sandbox.state(jid))
        assert final == "COMPLETED", slurm_sandbox.logs(jid)
    finally:
        slurm_sandbox.run(["scancel", jid], check=False)
    outs = [tmp_path / f"{jid}_{r}_log.out" for r in (0, 1)]
    name = check_one_run(mlflow_server, "submit", jid, outs, tmp_path)
    assert name.endswith(f"-{jid}"), name


MODEL_STEPS = 60  # room for a kill at step 8 and a requeue past step 16 of the restart
MODEL = [f"--train_steps={MODEL_STEPS}", "--log_every=1", "--checkpoint_every=5",
         "--eval_steps=1", "--batch_size=16", "--num_threads=1", "--seed=7",
         "--heartbeat_timeout=10"]  # fmt: skip


def check_model_run(uri: str, experiment: str, job_id: str, out: Path, tmp: Path) -> None:
    """One MLflow run of the bundled model's job: ``train/loss`` at every step once
    (log_every=1) and its evaluation; the chief's W&B runs all the job's."""
    client, run = the_job_run(uri, experiment, job_id)
    assert run.data.params["model"] == "mnist"
    history = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss"))
    assert history == list(range(1, MODEL_STEPS + 1)), history
    assert client.get_metric_history(run.info.run_id, "eval/accuracy")
    starts = events(out, "cluster")
    assert [s["restart_count"] for s in starts] == [0, 1, 2], starts  # the attempts
    offline = sorted(p.name for p in (tmp / "wandb").glob("offline-run-*"))
    assert len(offline) == 3, offline
    assert all(name.endswith(f"-slurm-{job_id}") for name in offline), offline


@pytest.mark.tf
@pytest.mark.parametrize("path", ["sbatch", "submit --model"])
def test_a_bundled_model_logs_to_one_run_through_a_killed_rank_and_a_requeue(
    slurm_sandbox: SlurmSandbox, mlflow_server: str, tmp_path: Path, path: str
) -> None:
    require(importlib.util.find_spec("tensorflow") is not None, "tensorflow (pip install .[cpu])")
    experiment = "model-" + path.replace(" --", "-")  # its own: the server is the module's
    env = {**tracker_env(mlflow_server, experiment, tmp_path), "WANDB_PROJECT": "slurmtf-e2e"}
    if path == "sbatch":
        job = SandboxJob(slurm_sandbox, tmp_path / "model", timeout=600)
        job.submit(MODEL, env={**env, "MAX_RESTARTS": "3"})
        jid, out, state, pattern = job.job_id, job.log_dir / "rank0.out", job.state, "models.mnist"
    else:
        done = slurm_sandbox.run(
            [PYTHON, "-m", "slurmtf.submit", "--nodes=2", "--time=10", "--max_restarts=3",
             f"--log_dir={tmp_path}", "--model=mnist", "--", *MODEL],
            env={**env, "SLURMTF_PORT_BASE": str(free_port_base(2))}, cwd=tmp_path, check=False,
        )  # fmt: skip
        found = re.search(r"submitted job (\d+)", done.stdout)
        assert found, done.stdout + done.stderr
        jid, out = found.group(1), tmp_path / f"{found.group(1)}_0_log.out"
        state, pattern = (lambda: slurm_sandbox.state(jid)), "slurmtf_models.mnist"
    try:
        wait_for(lambda: reached(out, 8, 0), state, "step 8")
        pids = rank_pids(jid, 1, pattern)
        assert pids, slurm_sandbox.logs(jid)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: reached(out, 16, 1), state, "the restart's progress")
        slurm_sandbox.run(["scontrol", "requeue", jid])
        assert slurm_sandbox.wait(jid, 600) == "COMPLETED", slurm_sandbox.logs(jid)
        show = slurm_sandbox.run(["scontrol", "show", "job", jid]).stdout
        assert "Restarts=1 " in show, show  # one requeue, the restart was in place
    finally:
        slurm_sandbox.run(["scancel", jid], check=False)
    check_model_run(mlflow_server, experiment, jid, out, tmp_path)
