"""A rank SIGKILLed mid-run trains again within seconds, inside the allocation.

On the ``recovery_sandbox`` (Slurm's default ``cred_expire`` of 120 s: a requeued job may
not start again before then, as on a real cluster) a 2-node job on the 3 nodes loses rank
1's process to SIGKILL (the OOM killer's way) while another user's exclusive 2-node job
waits for the nodes. On every launch path (``sbatch jobs/mnist.sbatch``, ``slurmtf
submit --model``, ``slurmtf submit --command`` with Keras ``fit`` and BackupAndRestore)
the job starts a new step in the same allocation: it trains again within
:data:`TRAINS_AGAIN_WITHIN_S` of the kill, Slurm's Restarts stays 0, the competing job
stays PENDING, and the job ends COMPLETED at the final step with one weights checksum.
Each test prints ``MEASURED <path> kill -> training again <s>``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slurmtf.cluster.ports import free_port_base
from slurmtf.events import read_events
from slurmtf.runtime.recovery.endings import reached_step
from slurmtf.sandbox.competitor import Competitor, submit_competitor
from tests.e2e.conftest import PYTHON, REPO, SlurmSandbox
from tests.e2e.jobruns import SandboxJob, check_status, first_count, rank_pids, wait_until
from tests.prereqs import require

pytestmark = [pytest.mark.slurm, pytest.mark.tf, pytest.mark.slow]

TRAINS_AGAIN_WITHIN_S = 60  # 30 s on an idle machine; CI shares 2 cores with other jobs
SAID = (
    r"restart 1 in place \(" + first_count("2") + r", MAX_RESTARTS\), \d+\.\d s after rank 1 was "
    r"killed by SIGKILL"
)
FIT_CHECKS = REPO / "tests" / "scripts" / "fit_checks.py"
MODEL = ["--train_steps=60", "--log_every=1", "--checkpoint_every=5", "--eval_steps=1",
         "--batch_size=16", "--num_threads=1", "--seed=7", "--heartbeat_timeout=10"]  # fmt: skip


@pytest.fixture
def rival(recovery_sandbox: SlurmSandbox) -> Iterator[list[Competitor]]:
    """The competing job, submitted by the test once its job runs; cancelled at the end."""
    require(importlib.util.find_spec("tensorflow") is not None, "TensorFlow (pip install .[cpu])")
    made: list[Competitor] = []
    yield made
    for competitor in made:
        competitor.cancel()


def kill_and_time(
    sandbox: SlurmSandbox, pids: list[int], again: Callable[[], bool], rivals: list[Competitor]
) -> float:
    """Submit the competitor, SIGKILL ``pids``, and the seconds until ``again()``."""
    rivals.append(submit_competitor(sandbox.sandbox, nodes=2, seconds=120))
    wait_for(lambda: rivals[0].state() == "PENDING", 30, "the competitor pending")
    assert pids, "no process of rank 1"
    assert all(pid > 0 for pid in pids), pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(again, 240, "training again after the kill")
    return time.monotonic() - killed


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise TimeoutError(what)


def trained_after_restart(out: Path) -> bool:
    """Rank 0's second ``cluster`` event has a training step after it."""
    starts = 0
    for event in read_events(out) if out.exists() else []:
        starts += event.get("event") == "cluster"
        if starts >= 2 and event.get("event") == "progress":
            return True
    return False


def reached(out: Path) -> int:
    """The highest step rank 0 has reported so far (0 before its first report)."""
    return reached_step(read_events(out) if out.exists() else []) or 0


def check_resumed_from_memory(outs: list[Path], at_kill: int, said: str) -> None:
    """The survivor saved the step it held at the kill (``rescued``), the restart resumed
    there (``resumed``; at least the step rank 0 had reported before the kill), and the
    job log's restart line says so."""
    rescued = [e for out in outs for e in read_events(out) if e.get("event") == "rescued"]
    assert rescued, "no rank saved from memory"
    step = max(e["step"] for e in rescued)
    resumed = [e for e in read_events(outs[0]) if e.get("event") == "resumed"]
    assert resumed, "the restart resumed from no saved state"
    assert resumed[-1]["step"] == step >= at_kill, (resumed, rescued, at_kill)
    line = rf"resumes at step {step} from rank \d+'s memory \(0 steps redone\)"
    assert re.search(line, said), said


def check_in_place(
    sandbox: SlurmSandbox, jid: str, text: Callable[[], str], rival: Competitor
) -> None:
    """Still in the allocation (the rival pends, Restarts=0), COMPLETED, the log's line."""
    assert rival.state() == "PENDING", f"the competing job got our nodes\n{text()[-3000:]}"
    assert sandbox.wait(jid, timeout=300) == "COMPLETED", sandbox.logs(jid)
    assert "Restarts=0 " in sandbox.run(["scontrol", "show", "job", jid]).stdout
    assert re.search(SAID, text()), text()[-3000:]


def submit(sandbox: SlurmSandbox, folder: Path, *flags: str) -> str:
    done = sandbox.run(
        [PYTHON, "-m", "slurmtf.submit", "--nodes=2", "--time=10", "--max_restarts=2",
         f"--log_dir={folder}", *flags],
        env={"SLURMTF_PORT_BASE": str(free_port_base(2))}, cwd=folder, check=False,
    )  # fmt: skip
    found = re.search(r"submitted job (\d+)", done.stdout)
    assert found, done.stdout + done.stderr
    return found.group(1)


def epochs(out: Path) -> list[int]:
    """The epochs Keras ``fit`` ended (``epoch_end`` events), in order."""
    found = read_events(out) if out.exists() else []
    return [e["epoch"] for e in found if e.get("event") == "epoch_end"]


def final_sums(outs: list[Path], steps: int | None) -> set[float]:
    sums = set()
    for out in outs:
        done = [e for e in read_events(out) if e.get("event") == "done"][-1]
        if steps is not None:
            assert done["step"] == steps, done
            assert done["start_step"] > 0, done  # resumed from a checkpoint
        sums.add(done["weights_checksum"])
    return sums


@pytest.mark.matrix
def test_a_killed_rank_of_an_sbatch_job_trains_again_in_place(
    recovery_sandbox: SlurmSandbox, rival: list[Competitor], tmp_path: Path
) -> None:
    job = SandboxJob(recovery_sandbox, tmp_path / "sbatch")
    state_home = tmp_path / "state"  # the user's job record
    state_home.mkdir()
    job.submit(MODEL, env={"MAX_RESTARTS": "2", "XDG_STATE_HOME": str(state_home)})
    try:
        wait_until(job, lambda: job.progress() >= 10, 300, "step 10")
        out = job.log_dir / "rank0.out"
        pids = rank_pids(job.job_id, 1)
        at_kill = reached(out)
        seconds = kill_and_time(recovery_sandbox, pids, lambda: trained_after_restart(out), rival)
        print(f"MEASURED sbatch kill -> training again {seconds:.1f} s")
        assert seconds < TRAINS_AGAIN_WITHIN_S, job.report()
        check_in_place(recovery_sandbox, job.job_id, job.job_output, rival[0])
        logs = [job.log_dir / f"rank{r}.out" for r in (0, 1)]
        check_resumed_from_memory(logs, at_kill, job.job_output())
        assert len(final_sums(logs, 60)) == 1
        check_status(recovery_sandbox, job.job_id, state_home, 60, redone=0)
    finally:
        job.cancel()


@pytest.mark.tf_core
def test_a_killed_rank_of_a_submitted_model_trains_again_in_place(
    recovery_sandbox: SlurmSandbox, rival: list[Competitor], tmp_path: Path
) -> None:
    jid = submit(recovery_sandbox, tmp_path, "--model=mnist", "--", *MODEL)
    try:
        out, err = tmp_path / f"{jid}_0_log.out", tmp_path / f"{jid}_0_log.err"
        wait_for(
            lambda: err.exists() and re.search(r"rank0 I step [1-9]\d/", err.read_text()),
            300,
            f"job {jid} made no progress",
        )
        pids = rank_pids(jid, 1, "slurmtf_models.mnist")
        at_kill = reached(out)
        seconds = kill_and_time(recovery_sandbox, pids, lambda: trained_after_restart(out), rival)
        print(f"MEASURED submit --model kill -> training again {seconds:.1f} s")
        assert seconds < TRAINS_AGAIN_WITHIN_S, recovery_sandbox.logs(jid)
        check_in_place(recovery_sandbox, jid, out.read_text, rival[0])
        logs = [tmp_path / f"{jid}_{r}_log.out" for r in (0, 1)]
        check_resumed_from_memory(logs, at_kill, out.read_text())
        assert len(final_sums(logs, 60)) == 1
    finally:
        recovery_sandbox.run(["scancel", jid], check=False)


@pytest.mark.tf_core
def test_a_killed_rank_of_a_fit_script_through_submit_command_trains_again_in_place(
    recovery_sandbox: SlurmSandbox, rival: list[Competitor], tmp_path: Path
) -> None:
    """``submit --command``: Keras ``fit`` with BackupAndRestore resumes from the backup
    (epoch 0 runs once), not from the start."""
    command = (f"python3 {FIT_CHECKS} --mode=backup --epochs=5 --steps=4 --sleep=0.25 "
               f"--model_dir={tmp_path / 'model'}")  # fmt: skip
    jid = submit(recovery_sandbox, tmp_path, f"--command={command}")
    try:
        out = tmp_path / f"{jid}_0_log.out"
        wait_for(lambda: 1 in epochs(out), 300, f"job {jid}: no epoch 1")
        before = len(epochs(out))
        pids = rank_pids(jid, 1, str(FIT_CHECKS))
        seconds = kill_and_time(recovery_sandbox, pids, lambda: len(epochs(out)) > before, rival)
        print(f"MEASURED submit --command kill -> training again {seconds:.1f} s")
        assert seconds < TRAINS_AGAIN_WITHIN_S, recovery_sandbox.logs(jid)
        check_in_place(recovery_sandbox, jid, out.read_text, rival[0])
        for rank in (0, 1):
            found = epochs(tmp_path / f"{jid}_{rank}_log.out")
            assert found.count(0) == 1, found  # resumed from the backup, not from epoch 0
            assert found[-1] == 4, found
        assert len(final_sums([tmp_path / f"{jid}_{r}_log.out" for r in (0, 1)], None)) == 1
    finally:
        recovery_sandbox.run(["scancel", jid], check=False)
