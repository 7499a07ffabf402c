"""Soak in CI: minutes of training with frequent collectives, resources must stay flat.

ResNet-20 with synchronised batch norm issues about 40 collectives per step, the case
where a per-collective timer once grew every rank by ~1,000 threads a second until the
job died. ``benchmarks.soak`` runs it as a real sandbox job and samples every rank's
threads, RSS and open fds from /proc; after the warm-up none may grow beyond a small
bound (threads and fds by 8, RSS by 5 % in total and by ``CI_MAX_RSS_SLOPE_MB_H`` per
hour over the last half of the samples, a bound derived from flat runs). The 30-minute
soaks of the default models and that bound are documented in docs/SOAK.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.soak import CI_MAX_RSS_SLOPE_MB_H, SoakPlan, markdown, run
from tests.e2e.conftest import SlurmSandbox

pytestmark = [pytest.mark.slurm, pytest.mark.tf, pytest.mark.slow]

MINUTES = float(os.environ.get("SLURMTF_SOAK_MINUTES", "3"))


def test_three_minutes_of_synchronised_resnet20_keep_every_rank_flat(
    slurm_sandbox: SlurmSandbox, tmp_path: Path
) -> None:
    plan = SoakPlan(
        model="resnet20",
        minutes=MINUTES,
        nodes=2,
        tasks_per_node=1,
        sample_every=3.0,
        warmup=45.0,
        model_flags=("--sync_batch_norm", "--batch_size=32", "--log_every=20"),
        max_rss_slope_mb_h=CI_MAX_RSS_SLOPE_MB_H,
        # The bound was set without warm ranks, whose imports 2 minutes in (auto) would
        # fall in the judged window on 2 shared cores; warm ranks have their own soak
        # (benchmarks/soak_failures.py).
        warm="0",
    )
    result = run(plan, sandbox=slurm_sandbox.sandbox, work_dir=tmp_path)
    print(markdown(result))
    assert result["passed"], markdown(result)
    assert result["steps"] >= 20, f"the job trained only {result['steps']} steps"
    for trends in result["ranks"].values():
        assert trends["threads"]["max"] < 400, trends  # ~125 per rank without a leak
