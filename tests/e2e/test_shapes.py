"""End-to-end: roles and heterogeneous steps resolved under the sandbox's real srun.

Every rank prints ``SLURM_PROCID SLURMD_NODENAME TF_CONFIG``; every rank must compute
the same cluster, and rank ``r``'s address must be the node Slurm really ran it on.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.e2e.conftest import PYTHON, REPO, SlurmSandbox

pytestmark = pytest.mark.slurm

PRINT = 'echo "@@ $SLURM_PROCID $SLURMD_NODENAME $("$0" -m slurmtf.resolver)"'
HET_JOBS = "chief:1@0,ps@0,worker@1"
HET_TYPES = ["chief:0", "ps:0", "worker:0", "worker:1"]


def check_ranks(output: str, ntasks: int, types: list[str]) -> list[str]:
    """The node of every rank, after checking that the ranks agree with Slurm and each other."""
    rows = sorted(
        (line.split(" ", 3)[1:] for line in output.splitlines() if line.startswith("@@ ")),
        key=lambda row: int(row[0]),
    )
    assert [int(row[0]) for row in rows] == list(range(ntasks)), output
    clusters = {json.dumps(json.loads(row[2])["cluster"]) for row in rows}
    assert len(clusters) == 1, output  # every rank computed the same cluster
    cluster = json.loads(clusters.pop())
    in_rank_order = [address for addresses in cluster.values() for address in addresses]
    nodes = []
    for rank, node, tf_config_json in rows:
        task = json.loads(tf_config_json)["task"]
        assert f"{task['type']}:{task['index']}" == types[int(rank)], output
        own = cluster[task["type"]][task["index"]]
        assert own.rsplit(":", 1)[0] == node, output  # where Slurm placed this very task
        assert in_rank_order[int(rank)] == own, output
        nodes.append(node)
    assert len(set(in_rank_order)) == ntasks  # one host:port per task
    return nodes


@pytest.mark.matrix
def test_het_srun_over_two_components(slurm_sandbox: SlurmSandbox) -> None:
    """``srun A : B`` makes a heterogeneous job itself (only SLURM_*_PACK_GROUP_N set)."""
    first = ["-N1", "--ntasks-per-node=2", "bash", "-c", PRINT, PYTHON]
    second = ["-N2", "--ntasks-per-node=1", "bash", "-c", PRINT, PYTHON]
    done = slurm_sandbox.run(
        ["srun", *first, ":", *second], timeout=60, env={"SLURMTF_JOBS": HET_JOBS}
    )
    nodes = check_ranks(done.stdout, 4, HET_TYPES)
    assert nodes[0] == nodes[1]
    assert len({nodes[0], nodes[2], nodes[3]}) == 3


def documented_het_script() -> str:
    """The heterogeneous job script of docs/RESOLVER.md, as a user copies it."""
    blocks = re.findall(r"```sh\n(.*?)```", (REPO / "docs" / "RESOLVER.md").read_text(), re.S)
    (script,) = [block for block in blocks if "#SBATCH hetjob" in block]
    return script


@pytest.mark.matrix
def test_documented_het_job_script(slurm_sandbox: SlurmSandbox, tmp_path: Path) -> None:
    """``#SBATCH hetjob`` and ``srun --het-group=0,1`` (where the old placement failed),
    run as docs/RESOLVER.md shows it, plus one step that prints every rank's TF_CONFIG."""
    script = tmp_path / "het.sbatch"
    documented = documented_het_script()
    assert f"SLURMTF_JOBS={HET_JOBS}" in documented
    script.write_text(
        documented.replace("python -m", f"{PYTHON} -m")
        + f"srun --het-group=0,1 bash -c '{PRINT}' {PYTHON}\n"
    )
    out = tmp_path / "het.out"
    job = slurm_sandbox.submit(script, sbatch_args=[f"--output={out}"])
    assert slurm_sandbox.wait(job, 90) == "COMPLETED", slurm_sandbox.logs(job) + out.read_text()
    text = out.read_text()
    nodes = check_ranks(text, 4, HET_TYPES)
    assert nodes[0] == nodes[1]
    assert len({nodes[0], nodes[2], nodes[3]}) == 3
    heads = [line for line in text.splitlines() if "2 workers on 3 nodes of 2 het comp" in line]
    assert len(heads) == 4, text  # --explain of every rank
    own = sorted(line.split()[1:3] for line in text.splitlines() if line.startswith("*  "))
    assert own == [["0", "chief:0@0"], ["1", "ps:0@0"], ["2", "worker:0@1"], ["3", "worker:1@1"]]


@pytest.mark.matrix
@pytest.mark.parametrize(
    ("layout", "jobs", "types"),
    [
        pytest.param(["-N3", "-n3"], "chief:1,ps:1,worker", ["chief:0", "ps:0", "worker:0"]),
        pytest.param(
            ["-N3", "-n6", "-m", "cyclic"],
            "chief:1,ps:2,worker",
            ["chief:0", "ps:0", "ps:1", "worker:0", "worker:1", "worker:2"],
            id="cyclic-N3-n6",
        ),
    ],
)
def test_roles_under_srun(
    slurm_sandbox: SlurmSandbox, layout: list[str], jobs: str, types: list[str]
) -> None:
    done = slurm_sandbox.run(
        ["srun", *layout, "bash", "-c", PRINT, PYTHON], timeout=60, env={"SLURMTF_JOBS": jobs}
    )
    nodes = check_ranks(done.stdout, len(types), types)
    assert len(set(nodes)) == 3


@pytest.mark.matrix
def test_bad_jobs_fail_every_rank_with_one_line(slurm_sandbox: SlurmSandbox) -> None:
    done = slurm_sandbox.run(
        ["srun", "-N2", "-n2", PYTHON, "-m", "slurmtf.resolver"],
        timeout=60,
        check=False,
        env={"SLURMTF_JOBS": "chief:1,ps:2,worker"},
    )
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "SLURMTF_JOBS=" in line]
    assert len(errors) == 2, done.stderr
    assert "asks for at least 4 task(s) but the step has 2" in errors[0]
    assert "HINT:" in errors[0]
