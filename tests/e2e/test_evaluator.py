"""End-to-end: MNIST on 2 workers with a sidecar evaluator (``--evaluator``) on the sandbox.

The workers train without evaluating and save every few steps; the evaluator task
(the step's last) evaluates every checkpoint, the final one included, and the job ends
COMPLETED by itself, with no error line in any rank's log.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from tests.e2e.conftest import SlurmSandbox
from tests.e2e.jobruns import check_clean_end, submit_job
from tests.prereqs import require

pytestmark = [pytest.mark.slurm, pytest.mark.tf]

STEPS = 30
EVERY = 10
ARGS = [
    "--evaluator",
    f"--train_steps={STEPS}",
    f"--checkpoint_every={EVERY}",
    "--keep_checkpoints=10",
    "--batch_size=32",
    "--eval_steps=2",
    "--log_every=10",
    "--num_threads=1",
    "--heartbeat_timeout=30",
]


@pytest.mark.tf_core
def test_sidecar_evaluator_evaluates_every_checkpoint(
    slurm_sandbox: SlurmSandbox, tmp_path: Path
) -> None:
    require(importlib.util.find_spec("tensorflow") is not None, "TensorFlow (pip install .[cpu])")
    run = submit_job(
        slurm_sandbox, tmp_path, "evaluator", script="mnist.sbatch", nodes=3, args=ARGS
    )
    try:
        assert run.finish() == "COMPLETED", run.report()
    finally:
        run.cancel()
    assert sorted(run.rank_events) == [0, 1, 2], run.report()
    roles = {rank: found[0]["role"] for rank, found in run.of("cluster").items()}
    assert roles == {0: "worker", 1: "worker", 2: "evaluator"}, run.report()

    saved = sorted(
        int(m.group(1))
        for p in (run.model_dir / "checkpoints").glob("ckpt-*.index")
        if (m := re.fullmatch(r"ckpt-(\d+)\.index", p.name))
    )
    assert saved == list(range(EVERY, STEPS + 1, EVERY)), run.report()
    evals = run.of("eval")
    assert evals[0] == [], "the chief paused to evaluate"
    assert evals[1] == [], "a worker paused to evaluate"
    assert [e["step"] for e in evals[2]] == saved, run.report()  # each checkpoint, the last too
    for event in evals[2]:
        assert event["examples"] == 2 * 32  # --eval_steps batches of the global batch
        assert 0.0 <= event["accuracy"] <= 1.0
        assert event["loss"] > 0

    done = run.of("done")
    assert [done[r][-1]["step"] for r in (0, 1)] == [STEPS, STEPS], run.report()
    assert done[2][-1]["role"] == "evaluator"
    assert done[2][-1]["step"] == STEPS
    assert run.of("cluster")[0][0]["local_replicas"] == 1  # counted over the 2 workers
    summaries = list((run.model_dir / "eval").glob("events.out.tfevents.*"))
    assert len(summaries) == 1, summaries  # the evaluator's, none from the chief
    logs = {r: list(run.log_dir.glob(f"rank{r}.*")) for r in (0, 1, 2)}
    # The evaluator may end before or after the workers: the job ends with the later.
    last = max(logs, key=lambda r: max(p.stat().st_mtime for p in logs[r]))
    check_clean_end(slurm_sandbox, run.job_id, logs, last_rank=last)
