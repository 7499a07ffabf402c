"""``model.fit`` with :class:`slurmtf.fit.TrackerLogger` keeps one MLflow run per job,
every step logged once, through a killed rank and the restart in place that computes its
epoch again: ``slurmtf submit --cluster=local --nodes=2 --command=...`` over a real
MLflow store (sqlite, no server), two real TensorFlow workers on loopback. The same run
has the allocation board ``slurmtf run`` adds to its ``fit``: both starts, the restart
with its cause and cost, goodput and rates in ``<log folder>/<job>_model/allocation``."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.helpers.boards import read_run

pytestmark = [pytest.mark.tf, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "fit_checks.py"
EPOCHS, STEPS, KILL_AT = 3, 5, 8  # rank 1 dies in the second epoch (steps 6-10)


def test_a_fit_script_logs_every_step_once_to_one_run_through_a_killed_rank(
    tmp_path: Path,
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = (f"{sys.executable} {SCRIPT} --mode=tracked --model_dir={tmp_path / 'model'} "
               f"--epochs={EPOCHS} --steps={STEPS} --kill_at={KILL_AT}")  # fmt: skip
    env = {"MLFLOW_TRACKING_URI": store, "SLURMTF_WARM_STANDBY": "0", "PYTHONPATH": str(ROOT),
           "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "slurmtf.cli", "submit", "--cluster=local", "--nodes=2",
         f"--command={command}", f"--log_dir={tmp_path / 'logs'}", "--max_restarts=2"],
        env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False,
    )  # fmt: skip
    said = done.stdout + done.stderr
    logs = "\n".join(
        p.read_text(errors="replace")[-3000:] for p in (tmp_path / "logs").glob("*") if p.is_file()
    )
    assert done.returncode == 0, said + logs
    assert "restart 1 in place" in said, said
    assert "after rank 1 was killed by SIGKILL" in said, said

    with warnings.catch_warnings():  # MLflow's sqlite store warns of SQLAlchemy's API
        warnings.simplefilter("ignore", DeprecationWarning)
        client = MlflowClient(tracking_uri=store)
        runs = client.search_runs(["0"])
        assert len(runs) == 1, [r.info.run_name for r in runs]  # one run for the job
        run = runs[0]
        history = {key: client.get_metric_history(run.info.run_id, key)
                   for key in ("train/loss", "eval/loss")}  # fmt: skip
    assert run.data.params == {"epochs": str(EPOCHS)}, run.data.params
    steps = sorted(m.step for m in history["train/loss"])
    assert steps == list(range(1, EPOCHS * STEPS + 1)), steps  # each step once
    evals = sorted(m.step for m in history["eval/loss"])
    assert evals == [STEPS * (e + 1) for e in range(EPOCHS)], evals

    (board,) = (tmp_path / "logs").glob("*_model/allocation")  # MODEL_DIR, as submit sets it
    scalars, texts = read_run(board)
    assert len(texts["allocation/starts"]) == 2, texts  # the chief alone, once a start
    (recovery,) = texts["allocation/recovery"]
    assert "cause: rank 1 was killed by SIGKILL" in recovery, recovery
    assert "s from the failure to this start" in recovery, recovery
    assert scalars["allocation/steps_per_sec"][-1][0] == EPOCHS * STEPS, scalars
    assert 0 < scalars["allocation/goodput/steps"][-1][1] <= 1, scalars
