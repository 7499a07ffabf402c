"""Variables made without the chief's broadcast of their initial values end as the
chief's after one all-reduce (slurmtf.tf.collectives.local_initial_values,
``Steps.sync_from_chief``), and the ranks agree on that sync from one collective
(``Steps.check_same_step``): two real workers on loopback, on every release."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmtf.cluster.ports import free_port_base

pytestmark = [pytest.mark.tf, pytest.mark.tf_core]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "scripts" / "initial_values.py"


def test_workers_built_without_the_broadcast_end_with_the_chiefs_values() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    base = free_port_base(2)
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    command = [sys.executable, str(SCRIPT)]
    ranks = [subprocess.Popen([*command, str(i), str(base)], env=env, **pipes) for i in (0, 1)]
    outs = [rank.communicate(timeout=300) for rank in ranks]
    for rank, (_, err) in zip(ranks, outs, strict=True):
        assert rank.returncode == 0, err[-3000:]
    chief, worker = (json.loads(out.strip().splitlines()[-1]) for out, _ in outs)
    assert [chief["local"], worker["local"]] == [True, True]
    assert [chief["needed"], worker["needed"]] == [True, True]  # only rank 1 asked
    # Each worker drew its own initial values; the sync made them the chief's.
    assert worker["before"]["checksum"] != chief["before"]["checksum"]
    assert worker["before"]["step"] == 3
    assert worker["after"] == chief["after"] == {**chief["before"], "step": 0}
