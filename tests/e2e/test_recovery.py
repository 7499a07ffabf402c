"""Hard failures at random moments on the sandbox: the job recovers by itself.

A two-node ``jobs/mnist.sbatch`` run on the three-node sandbox (one node spare) is
broken once at a random step, in one of three ways:

* ``rank``: rank 1's Python process gets SIGKILL (a crash, an OOM kill);
* ``node``: rank 1's node dies: its ``slurmd`` and every process of the job there get
  SIGKILL (:func:`slurmtf.sandbox.nodefaults.kill_node`);
* ``freeze``: rank 1's node hangs: ``slurmd``, ``slurmstepd`` and the tasks get SIGSTOP.

No one resubmits. A killed rank restarts in place: a new step in the same allocation.
A lost node leaves the two-node job fewer nodes than it needs (no spare, no range), so
the job script requeues the job (same id) without the node that stopped answering.
The job must end COMPLETED at the same final step and with the same weights
(``weights_checksum``) as the uninterrupted run (the preemption tests' baseline, same
flags), with restart count 1 and, after a node failure, without that node. Printed per
run: ``RECOVERED <kind> <seconds from the failure to the first training step after the
restart>`` (also appended to ``$SLURMTF_FAULT_REPORT``).

CI runs one moment of ``node`` and ``freeze``: the rank kill restarting in place is
tests/e2e/test_kill_in_place.py's, on every launch path. ``SLURMTF_RECOVERIES=N`` runs N
moments per kind, ``SLURMTF_RECOVERY_KINDS`` picks the kinds (the soak,
``scripts/recovery_soak.sh``, runs all three), ``SLURMTF_RECOVERY_SEED`` the moments.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from collections.abc import Iterator

import pytest

from slurmtf.sandbox import Sandbox, nodefaults
from tests.e2e.conftest import SlurmSandbox, require_sandbox_prereqs
from tests.e2e.jobruns import ARGS, STEPS, SandboxJob, check_status, first_count, wait_until
from tests.helpers.localjobs import report

pytestmark = [pytest.mark.slurm, pytest.mark.tf, pytest.mark.slow]

KINDS = ("rank", "node", "freeze")
CHOSEN = os.environ.get("SLURMTF_RECOVERY_KINDS", "node freeze").split()
COUNT = int(os.environ.get("SLURMTF_RECOVERIES", "1"))
SEED = int(os.environ.get("SLURMTF_RECOVERY_SEED", "2027"))
_rng = random.Random(SEED)
# (kind, step, run): the run number keeps two draws of one kind and step apart. Every
# kind draws its moments, so a seed gives each kind the same moments whichever are chosen.
DRAWN = [(kind, _rng.randint(3, STEPS - 25), i) for i in range(COUNT) for kind in KINDS]
CASES = [case for case in DRAWN if case[0] in CHOSEN]
if not CHOSEN or set(CHOSEN) - set(KINDS):
    raise ValueError(
        f"SLURMTF_RECOVERY_KINDS={' '.join(CHOSEN)!r}: not kinds of failure. "
        f"HINT: name some of {' '.join(KINDS)}, separated by spaces"
    )


@pytest.fixture(scope="module")
def own_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    """A sandbox of its own, whose nodes have network namespaces of their own: a frozen
    rank keeps its port on its node only, as on separate machines (on the shared
    loopback it would hold the port its replacement on the spare node needs). Slurm
    declares a silent node failed after 20 s (SlurmdTimeout; 60 s in the shared sandbox,
    300 s by default on real clusters)."""
    require_sandbox_prereqs()
    sandbox = Sandbox(
        tmp_path_factory.mktemp("recovery"), nodes=3, link="unshaped", slurmd_timeout=20
    )
    sandbox.up()
    try:
        yield SlurmSandbox(sandbox)
    finally:
        sandbox.down()


@pytest.fixture
def mended(own_sandbox: SlurmSandbox) -> Iterator[list[int]]:
    """Frozen PIDs to thaw; afterwards every node runs a slurmd and is back in service."""
    slurm_sandbox = own_sandbox
    frozen: list[int] = []
    yield frozen
    if not nodefaults.mend(slurm_sandbox.sandbox, frozen, timeout=120):
        pytest.fail(f"nodes not back in service: {slurm_sandbox.sandbox.node_states()}")


def restarted_step(job: SandboxJob) -> int | None:
    """The first step rank 0 logged after the restart (its second ``cluster`` event), if
    any yet: from a checkpoint, or from step 0 when it failed before the first one."""
    starts = 0
    for line in job.text("rank0.out").splitlines():
        starts += '"event": "cluster"' in line
        if starts >= 2 and '"event": "progress"' in line:
            step: int = json.loads(line)["step"]
            return step
    return None


@pytest.mark.parametrize("case", CASES, ids=[f"{k}-step{m}-{i}" for k, m, i in CASES])
def test_a_hard_failure_recovers_by_itself(
    own_sandbox: SlurmSandbox,
    baseline: SandboxJob,
    jobs: list[SandboxJob],
    mended: list[int],
    case: tuple[str, int, int],
) -> None:
    kind, moment, run = case
    slurm_sandbox = own_sandbox
    job = SandboxJob(slurm_sandbox, slurm_sandbox.dir / f"run-{kind}-{moment}-{run}")
    jobs.append(job)
    state_home = slurm_sandbox.dir / f"state-{kind}-{moment}-{run}"  # the user's job record
    job.submit(
        ARGS,
        env={"MAX_RESTARTS": "2", "SLURMTF_NODE_PROBE_S": "10", "XDG_STATE_HOME": str(state_home)},
    )
    wait_until(job, lambda: job.progress() >= moment, 300, f"step {moment}")
    node = job.rank_node(1)
    if kind == "rank":
        job.signal_rank(1, signal.SIGKILL)
    elif kind == "node":
        nodefaults.kill_node(slurm_sandbox.sandbox, node)
    else:
        mended.extend(nodefaults.freeze_node(slurm_sandbox.sandbox, node))
    failed = time.monotonic()
    wait_until(job, lambda: restarted_step(job) is not None, 400, "training after the restart")
    recovered = time.monotonic() - failed
    report(f"recovery_{kind}", recovered)
    print(f"RECOVERED {kind} {recovered:.1f} (failure at step >= {moment}, node {node})")
    assert job.wait(400) == "COMPLETED", job.report()

    finals = [job.events(rank, "done")[-1] for rank in (0, 1)]
    assert [f["step"] for f in finals] == [STEPS, STEPS], job.report()
    assert [f["restart_count"] for f in finals] == [1, 1], job.report()
    assert finals[0]["weights_checksum"] == finals[1]["weights_checksum"], finals
    clusters = job.events(0, "cluster")
    assert [c["restart_count"] for c in clusters] == [0, 1], clusters
    hosts = {w.rsplit(":", 1)[0] for w in clusters[-1]["workers"]}
    output = job.job_output()
    if kind == "rank":  # a new step in the same allocation, no trip through the queue
        said = r"restart 1 in place \(" + first_count("2") + r", MAX_RESTARTS\)"
        assert re.search(said, output), output
        assert "after rank 1 was killed by SIGKILL" in output, output
        assert "requeueing job" not in output, output
        show = slurm_sandbox.run(["scontrol", "show", "job", job.job_id]).stdout
        assert "Restarts=0 " in show, show
    else:
        # The job script's watch found the node silent, ended the step and requeued the
        # job without it once Slurm had taken the node out (SlurmdTimeout; a job requeued
        # earlier gets no GRES), or Slurm declared the node failed and requeued it itself.
        said = (f"avoids node(s) {node}", f"take node(s) {node} out of the job", "NODE FAILURE")
        assert any(words in output for words in said), output
        assert node not in hosts, f"the restarted job ran on the failed {node}: {hosts}"

    if kind == "rank":  # found by its id alone, from another directory
        check_status(slurm_sandbox, job.job_id, state_home, STEPS)

    assert baseline.wait(400) == "COMPLETED", baseline.report()
    reference = baseline.events(0, "done")[-1]
    assert finals[0]["weights_checksum"] == pytest.approx(
        reference["weights_checksum"], rel=1e-9, abs=1e-9
    ), f"recovered {finals[0]}\nstraight {reference}"
