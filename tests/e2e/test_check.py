"""End-to-end: ``slurmtf check`` names the node whose link is a tenth of the others'.

One 4-node sandbox with links of their own (1gbit each way, node3 at 100mbit). From the
"login node" ``slurmtf check --nodes=4`` submits a check job: exit 1, node3 and its link
named. Then ``slurmtf sandbox link node3 1gbit`` mends the node and ``slurmtf check``
run inside an allocation (``salloc``) finds it healthy: exit 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmtf.sandbox import Sandbox
from tests.e2e.conftest import SlurmSandbox, require_sandbox_prereqs
from tests.prereqs import require

pytestmark = pytest.mark.slurm

CHECK = [sys.executable, "-m", "slurmtf.cli", "check", "--link_rounds=3", "--link_seconds=0.4"]


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    require_sandbox_prereqs()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, check=False)
    require(netns.returncode == 0, "ip netns (iproute2)")
    sandbox = Sandbox(tmp_path_factory.mktemp("check"), nodes=4, gpus_per_node=0,
                      link="1gbit", node_link=("node3=100mbit",))  # fmt: skip
    sandbox.up()
    try:
        yield SlurmSandbox(sandbox)
    finally:
        sandbox.down()


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
