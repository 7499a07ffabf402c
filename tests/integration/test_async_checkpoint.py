"""Asynchronous checkpoints (``--async_checkpoint``, slurmtf.training.checkpoints): saves
that write in the background hold the values of their step, name the latest only once
written, and prune a rescue only then; on Keras 3 too, whose variables' copies
slurmtf.tf.compat.mend_async_copy mends (the second save failed without it)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.prereqs import require

pytestmark = [pytest.mark.tf, pytest.mark.tf_core]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "async_saves.py"


def test_asynchronous_saves_hold_their_step_and_prune_rescues_once_written(
    tmp_path: Path,
) -> None:
    require(importlib.util.find_spec("tensorflow") is not None, "tensorflow (pip install .[cpu])")
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    env["TMPDIR"] = str(tmp_path / "tmp")  # where the non-chief's folder goes
    env.pop("TF_CONFIG", None)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(model_dir)],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["asynchronous"] is True  # 2.15 to 2.21 all have them
    assert result["latest_step"] == 4
    assert result["equal"], "the restored weights are not those of the last save"
    assert result["rescues_before_sync"] == 1  # the save of its step was still writing
    assert result["rescues_after_sync"] == 0
    assert result["files"] == ["checkpoints", "rescue"]  # the non-chief wrote nothing here
    assert result["scratch_left"] == []  # its own folder, removed at its end
    saved = sorted(p.name for p in (model_dir / "checkpoints").iterdir())
    assert "checkpoint" in saved, saved
    assert "ckpt-4.index" in saved, saved
