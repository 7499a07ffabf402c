"""The chief's allocation summaries as TensorBoard reads them: a tiny 1-rank MNIST run
inside a fake Slurm step, started twice, with a recovery record beside its logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.boards import read_run
from tests.helpers.datafiles import write_mnist
from tests.helpers.localjobs import Job

pytestmark = [pytest.mark.tf, pytest.mark.slow]


def test_chief_writes_allocation_scalars_and_texts_once_across_starts(
    tmp_path: Path, jobs: list[Job]
) -> None:
    data = write_mnist(tmp_path / "mnist", n_train=64, n_eval=16)
    logs, model = tmp_path / "logs", tmp_path / "model"
    job = Job(tmp_path, 1, "a")
    job.cluster.in_slurm = True  # a Slurm step of one task: the chief knows its job id
    record = {"time": 5.0, "job_id": str(job.cluster.job_id), "attempt": 0,
              "action": "restart", "why": "rank 0 lost its peer", "status": 1, "seconds": 7.0,
              "line": "restarting in place (1 of 3)"}  # fmt: skip
    logs.mkdir()
    (logs / f"recovery-{job.cluster.job_id}.jsonl").write_text(json.dumps(record) + "\n")
    common = [
        f"--data_dir={data}", "--batch_size=8", "--log_every=2", "--eval_steps=1",
        f"--model_dir={model}", f"--log_dir={logs}", "--timing_every=0.001",
        "--straggler_window=0.001",
    ]  # fmt: skip
    jobs.append(job)
    assert job.start("mnist", [*common, "--train_steps=8"]).wait() == [0], job.logs()
    again = Job(tmp_path, 1, "b")
    again.cluster.in_slurm, again.cluster.job_id = True, job.cluster.job_id
    jobs.append(again)
    assert again.start("mnist", [*common, "--train_steps=12"]).wait() == [0], again.logs()

    scalars, texts = read_run(model / "allocation")
    compute = scalars["allocation/rank0/compute_s"]
    assert len(compute) >= 4  # one point per timing window, over both starts
    assert all(value > 0 for _, value in compute)
    assert "allocation/rank0/wait_s" in scalars
    assert "allocation/compute_s/median" in scalars
    assert scalars["allocation/goodput/steps"][-1][1] == pytest.approx(1.0)
    assert 0 < scalars["allocation/goodput/time"][-1][1] <= 1
    assert not any(tag.endswith("/gpu0/utilization") for tag in scalars)  # no nvidia-smi
    assert texts["allocation/starts"] == [
        "start 1 (restart count 0) at step 0; steps computed again: 0",
        "start 2 (restart count 0) at step 8; steps computed again: 0",
    ]
    (recovery,) = texts["allocation/recovery"]  # the second start did not write it again
    assert "cause: rank 0 lost its peer" in recovery
    train, _ = read_run(model / "train")
    assert "examples_per_sec" in train
