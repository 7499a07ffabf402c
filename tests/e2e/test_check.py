"""End-to-end: ``slurmtf check`` and ``slurmtf status`` name the node whose link is a
tenth of the others'.

One 4-node sandbox with links of their own (1gbit each way, node3 at 100mbit). From the
"login node" ``slurmtf check --nodes=4`` submits a check job: exit 1, node3 and its link
named. Then ``slurmtf sandbox link node3 1gbit`` mends the node and ``slurmtf check``
run inside an allocation (``salloc``) finds it healthy: exit 0. A 4-worker MNIST job then
trains on the mended links until node3's link is cut to a tenth mid-run: ``slurmtf status``
names node3 as the straggler while the job runs, and the job completes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmtf.sandbox import Sandbox
from tests.e2e.conftest import SlurmSandbox, require_sandbox_prereqs
from tests.e2e.jobruns import submit_job, wait_until
from tests.prereqs import require

pytestmark = pytest.mark.slurm

CHECK = [sys.executable, "-m", "slurmtf.cli", "check", "--link_rounds=3", "--link_seconds=0.4"]


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    require_sandbox_prereqs()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, check=False)
    require(netns.returncode == 0, "ip netns (iproute2)")
    # slurmd_timeout: a saturated 100mbit link can hold slurmd's replies back for a while
    sandbox = Sandbox(tmp_path_factory.mktemp("check"), nodes=4, gpus_per_node=0,
                      link="1gbit", node_link=("node3=100mbit",), slurmd_timeout=300)  # fmt: skip
    sandbox.up()
    try:
        yield SlurmSandbox(sandbox)
    finally:
        sandbox.down()


@pytest.mark.matrix
def test_check_names_the_slow_node_then_passes_once_mended(
    four: SlurmSandbox, tmp_path: Path
) -> None:
    bad = four.run([*CHECK, "--nodes=4", f"--out_dir={tmp_path}"], timeout=180, check=False)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    closing = bad.stdout.strip().splitlines()[-1]
    assert closing.startswith("OUTLIER node3: link"), bad.stdout
    assert "below the median" in closing
    for other in ("node1", "node2", "node4"):
        assert other not in closing, bad.stdout
    (verdict_file,) = tmp_path.glob("check-*.json")
    data = json.loads(verdict_file.read_text())
    assert {o["node"] for o in data["outliers"]} == {"node3"}
    node3 = data["nodes"][2]
    assert node3["link_out_gbps"] < 0.12, node3  # the 100mbit cap, measured
    assert data["nodes"][0]["link_out_gbps"] > 0.3, data["nodes"][0]

    four.run([sys.executable, "-m", "slurmtf.cli", "sandbox", "link", "--dir", str(four.dir),
              "node3", "1gbit"])  # fmt: skip
    good = four.run(["salloc", "-N4", *CHECK, f"--json={tmp_path}/good.json"], timeout=180,
                    check=False)  # fmt: skip
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.strip().splitlines()[-1].startswith("healthy: 4 nodes")
    assert json.loads((tmp_path / "good.json").read_text())["healthy"] is True


# A 4-worker MNIST job (12.8 MB of gradients a step: the cut link dominates its steps),
# timing every 2 s, a straggler reported after 6 s.
STRAGGLER_JOB = [
    "--batch_size=16", "--eval_steps=1", "--num_threads=1", "--seed=3", "--log_every=5",
    "--train_steps=50", "--epochs_between_evals=1000", "--timing_every=2",
    "--straggler_window=6", "--heartbeat_timeout=300", "--stall_timeout=600",
]  # fmt: skip


def _status(four: SlurmSandbox, job_id: str) -> str:
    return four.run([sys.executable, "-m", "slurmtf.cli", "status", job_id]).stdout


def _link(four: SlurmSandbox, rate: str) -> None:
    four.run([sys.executable, "-m", "slurmtf.cli", "sandbox", "link", "--dir", str(four.dir),
              "node3", rate])  # fmt: skip


@pytest.mark.tf
def test_status_names_the_node_whose_link_is_cut_while_the_job_runs(
    four: SlurmSandbox, tmp_path: Path
) -> None:
    _link(four, "1gbit")  # whatever the test above left
    started = time.monotonic()
    job = submit_job(four, tmp_path, "straggler", script="mnist.sbatch", nodes=4,
                     args=STRAGGLER_JOB, sbatch_args=["--gres=none"], timeout=400)  # fmt: skip
    # one whole interval after the first step (which traces the step function)
    wait_until(job, lambda: len(job.events(0, "timing")) >= 2, 240, "two timing intervals")
    before = [job.events(rank, "timing")[-1] for rank in range(4)]
    _link(four, "100mbit")
    cut = time.monotonic()
    shown = ""

    def node3_named() -> bool:
        nonlocal shown
        shown = _status(four, job.job_id)
        return "straggler: node3 (rank 2): " in shown

    wait_until(job, node3_named, 150, "slurmtf status naming node3")
    running = job.state()
    _link(four, "1gbit")
    print(f"MEASURED straggler_named_after_cut_s {time.monotonic() - cut:.1f}")
    after = [job.events(rank, "timing")[-1] for rank in range(4)]
    for rank in range(4):
        print(f"MEASURED timing rank{rank} 1gbit {before[rank]}\n  node3 cut {after[rank]}")
    print(f"MEASURED status while running:\n{shown}")
    assert running == "RUNNING", job.report()
    assert "% of each step waiting on it since" in shown, shown
    assert job.finish() == "COMPLETED", job.report()
    print(f"MEASURED straggler_test_s {time.monotonic() - started:.1f}")
    named = [e for e in job.of("straggler")[0] if e["node"] == "node3"]
    assert len(named) == 1, job.of("straggler")  # reported once, however long it lasted
    assert named[0]["kind"] == "link", named
    assert named[0]["rank"] == 2, named
    for rank in range(1, 4):
        assert not job.of("straggler")[rank], "only the chief reports stragglers"
        assert job.of("timing")[rank], f"rank {rank} printed no timing event"
