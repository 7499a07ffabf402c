"""The GPU check's verdicts, from recorded events; its job loop with a fake Slurm."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from benchmarks import gpu_check
from benchmarks.gpu_check import JobOutcome, check_job, images_per_sec, report


def _cluster(rank: int, nodes: int, per_node: int, **over: Any) -> dict[str, Any]:
    workers = [f"gpu{r // per_node + 1}:15000" for r in range(nodes * per_node)]
    event = {
        "event": "cluster", "rank": rank, "num_workers": nodes * per_node, "workers": workers,
        "collective": "nccl", "gpus": 1, "cuda_visible_devices": str(rank % per_node),
        "local_replicas": 1, "planned_replicas": 1,
    }  # fmt: skip
    return {**event, **over}


def _job(nodes: int = 1, per_node: int = 4, rate: float = 4000.0, **over: Any) -> JobOutcome:
    job = JobOutcome(f"{nodes}node", nodes, per_node, state="COMPLETED", job_id="77")
    job.clusters = {r: _cluster(r, nodes, per_node, **over) for r in range(nodes * per_node)}
    job.progress = [{"event": "progress", "examples_per_sec": v} for v in (50.0, rate, rate)]
    return job


def _verdicts(job: JobOutcome) -> dict[str, bool]:
    return {c.name: c.ok for c in check_job(job)}


def test_a_healthy_pair_of_jobs_passes() -> None:
    text, ok = report([_job(1), _job(2, rate=7600.0)])
    assert ok
    assert text.count("  PASS  ") == 12
    assert "RESULT: PASS" in text
    assert "4,000 images/s (1,000 per GPU)" in text
    assert "2-node scaling: 95% of 2x the 1-node images/s" in text


def test_cpu_only_fails_and_says_no_gpu_was_found() -> None:
    job = _job(collective="ring", gpus=0)
    job.state = "CANCELLED (a rank sees no GPU)"
    job.progress = []
    text, ok = report([job])
    assert not ok
    assert "RESULT: FAIL" in text
    line = next(x for x in text.splitlines() if "GPU found" in x)
    assert line.strip().startswith("FAIL  GPU found: no GPU found: TensorFlow sees no GPU")
    assert "rank 0 (gpu1, CUDA_VISIBLE_DEVICES=0)" in line
    assert "HINT:" in line
    assert not _verdicts(job)["NCCL"]


CASES = [
    # (what changes, the failing check)
    ({"cuda_visible_devices": "0,1,2,3", "planned_replicas": 4}, "one GPU per worker"),
    ({"cuda_visible_devices": "0"}, "one GPU per worker"),  # all four on GPU 0
    ({"local_replicas": 4}, "one GPU per worker"),  # TF mirrors over more than planned
    ({"num_workers": 2}, "all ranks started"),
    ({"collective": "ring"}, "NCCL"),
]


@pytest.mark.parametrize(("over", "failing"), CASES)
def test_each_problem_fails_its_own_check(over: dict[str, Any], failing: str) -> None:
    verdicts = _verdicts(_job(**over))
    assert [name for name, ok in verdicts.items() if not ok] == [failing]


def test_missing_ranks_and_no_events() -> None:
    job = _job()
    del job.clusters[3]
    verdicts = _verdicts(job)
    assert not verdicts["all ranks started"]
    assert verdicts["one GPU per worker"]
    job.clusters.clear()
    job.state = "FAILED"
    assert not any(_verdicts(job).values())
    assert report([])[1] is False


def test_images_per_sec_skips_the_first_interval() -> None:
    assert images_per_sec([]) is None
    assert images_per_sec([{"examples_per_sec": 10.0}]) == 10.0
    rates = [1.0, 100.0, 120.0, 110.0]
    assert images_per_sec([{"examples_per_sec": v} for v in rates]) == 110.0


class FakeSlurm:
    """sbatch writes CPU-only ranks' events where the job script would; squeue says RUNNING."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str]) -> str:
        self.calls.append(list(args))
        if args[0] == "sbatch":
            export = next(a for a in args if a.startswith("--export="))
            log_dir = Path(export.split("LOG_DIR=")[1])
            for rank in range(2):
                event = _cluster(rank, 1, 2, gpus=0, collective="ring")
                (log_dir / f"rank{rank}.out").write_text(json.dumps(event) + "\n")
            return "41\n"
        if args[0] == "squeue":
            return "RUNNING\n"
        return ""


def test_main_cancels_a_job_whose_ranks_see_no_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slurm = FakeSlurm()
    argv = ["--gpus_per_node=2", f"--out={tmp_path}", "--partition=gpu", "--steps=10"]
    assert gpu_check.main(argv, runner=slurm) == 1
    out = capsys.readouterr().out
    assert "no GPU found" in out
    assert out.rstrip().endswith("RESULT: FAIL")
    assert (tmp_path / "report.txt").read_text().rstrip().endswith("RESULT: FAIL")
    sbatch = [c for c in slurm.calls if c[0] == "sbatch"]
    assert len(sbatch) == 1  # the 2-node job is not tried after a GPU-less one
    assert {"--gres=gpu:2", "--ntasks-per-node=2", "--partition=gpu"} <= set(sbatch[0])
    assert "--batch_size=512" in sbatch[0]
    assert ["scancel", "41"] in slurm.calls


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main(["--gpus_per_node=0"], runner=FakeSlurm()) == 2
    assert "HINT:" in capsys.readouterr().err
    assert gpu_check.main(["--gpus_per_node=4", "--nodes=x"], runner=FakeSlurm()) == 2
