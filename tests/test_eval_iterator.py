"""Every evaluation reads the same batches, though one eval iterator serves them all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slurmtf.events import named, parse_events
from slurmtf.local.step import scrubbed_env

pytestmark = [pytest.mark.tf]

REPO = Path(__file__).resolve().parents[1]


def test_evaluations_of_the_same_weights_agree(tmp_path: Path) -> None:
    # Batch 300: 20 steps an epoch, an evaluation every 20 steps on 2 of the 1,000
    # synthetic eval examples' batches. An iterator that ran on would give the second
    # evaluation examples 600-999 and 0-199; a learning rate of 1e-12 keeps the weights.
    flags = ["--batch_size=300", "--train_steps=40", "--eval_steps=2", "--learning_rate=1e-12",
             "--num_threads=1", "--log_every=20", f"--model_dir={tmp_path}"]  # fmt: skip
    env = scrubbed_env(extra={"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"})
    done = subprocess.run(
        [sys.executable, "-m", "models.mnist", *flags],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    evals = named(parse_events(done.stdout + done.stderr), "eval")
    assert [e["step"] for e in evals] == [20, 40]
    assert [e["examples"] for e in evals] == [600, 600]
    assert evals[1]["loss"] == pytest.approx(evals[0]["loss"], rel=1e-5)
    assert evals[1]["accuracy"] == pytest.approx(evals[0]["accuracy"], abs=1e-9)
