"""The models' entry point applies each task's GPU share before TensorFlow starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FakeSlurmEnv

REPO = str(Path(__file__).resolve().parents[1])


def _placement(out: str) -> dict[str, object]:
    (line,) = [x for x in out.splitlines() if x.startswith('{"event": "placement"')]
    event: dict[str, object] = json.loads(line)
    return event


def test_placement_only_narrows_the_shared_list(
    fake_slurm_env: FakeSlurmEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    from models import mnist

    fake_slurm_env.step(
        "node[1-2]", "4(x2)", 6, SLURM_LOCALID=2, SLURMD_NODENAME="node2",
        CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_STEP_GPUS="0,1,2,3", SLURM_GPUS_ON_NODE=4,
        SLURMTF_PORT_BASE=23000,
    )  # fmt: skip
    assert mnist.main(["--placement_only"]) == 0
    event = _placement(capsys.readouterr().out)
    assert (event["rank"], event["node"], event["local_id"]) == (6, "node2", 2)
    assert (event["cuda_visible_devices"], event["planned_replicas"]) == ("2", 1)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"  # written for TensorFlow to read


def test_one_task_per_node_keeps_every_gpu(
    fake_slurm_env: FakeSlurmEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    from models import resnet

    fake_slurm_env.step(
        "node[1-2]", "1(x2)", 1, CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_GPUS_ON_NODE=4,
        SLURMTF_PORT_BASE=23000,
    )  # fmt: skip
    assert resnet.main(["--resnet_size=20", "--placement_only"]) == 0
    event = _placement(capsys.readouterr().out)
    assert (event["cuda_visible_devices"], event["planned_replicas"]) == ("0,1,2,3", 4)


def test_a_shared_gpu_stops_the_model_with_one_line(
    fake_slurm_env: FakeSlurmEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    from models import mnist

    fake_slurm_env.step(
        "node[1-2]", "4(x2)", 1, SLURM_LOCALID=1, CUDA_VISIBLE_DEVICES="0", SLURM_STEP_GPUS="0",
        SLURM_GPUS_ON_NODE=1,
    )  # fmt: skip
    assert mnist.main(["--placement_only"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("models.mnist: CUDA_VISIBLE_DEVICES='0': holds 1 GPU(s) for the 4 tasks")
    assert "HINT:" in err
    assert "\n" not in err


def test_the_split_happens_before_tensorflow_is_imported(fake_slurm_env: FakeSlurmEnv) -> None:
    env = {
        **os.environ,
        **FakeSlurmEnv.step_vars(
            "node[1-2]", "2(x2)", 1, SLURM_LOCALID=1, CUDA_VISIBLE_DEVICES="0,1",
            SLURM_STEP_GPUS="0,1", SLURMTF_PORT_BASE=23000,
        ),
        "PYTHONPATH": REPO,
    }  # fmt: skip
    code = (
        "import sys\nfrom slurmtf.training.app import resolve_info\n"
        "info = resolve_info()\n"
        "assert 'tensorflow' not in sys.modules, 'TensorFlow imported before the split'\n"
        "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], info.planned_replicas)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1"]
