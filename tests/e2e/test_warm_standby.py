"""Warm ranks on a real Slurm: the next attempt's step waits beside the one that trains,
and a killed rank's restart takes it over instead of starting new processes.

With ``SLURMTF_WARM_STANDBY=1`` a 2-node MNIST job (``sbatch jobs/mnist.sbatch``,
``slurmtf submit --model`` and ``slurmtf submit --command``, whose warm launchers wait
before they start the command) starts its warm step (``srun --overlap``) after the chief's
first step. Once both warm ranks say they are ready (``warm`` events: TensorFlow and
Keras imported), rank 1's training process is SIGKILLed. The restart tells the warm
ranks to go: the job's log says so, the step resumes from rank 0's memory with 0 steps
redone, the job ends COMPLETED with one weights checksum, and nothing warm is left (no
process, no go file). Each test prints ``MEASURED <path> warm kill -> training again``.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.harness import processes
from slurmtf.cluster.ports import free_port_base
from slurmtf.events import read_events
from slurmtf.runtime.rank.standby import waits
from slurmtf.sandbox.daemons import log_tail
from tests.e2e.conftest import PYTHON, TERMINAL, SlurmSandbox
from tests.e2e.jobruns import SandboxJob, check_status, rank_pids, wait_until
from tests.e2e.test_kill_in_place import (
    check_resumed_from_memory,
    final_sums,
    reached,
    trained_after_restart,
)
from tests.helpers.localjobs import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.tf, pytest.mark.slow]

WARM = {"SLURMTF_WARM_STANDBY": "1", "MAX_RESTARTS": "2"}
STEPS = 150
MODEL = [f"--train_steps={STEPS}", "--log_every=1", "--checkpoint_every=25", "--eval_steps=1",
         "--batch_size=16", "--num_threads=1", "--seed=7", "--heartbeat_timeout=10"]  # fmt: skip
AGAIN_WITHIN_S = 30  # 3.5 s on an idle machine; CI shares 2 cores with other jobs
# A warm launcher saves srun's and submitit's start, not the command's own imports
# (TensorFlow's: 11-24 s on a loaded 2-core machine): 6.3-12.7 s measured.
COMMAND_AGAIN_WITHIN_S = 90


def warm_ready(outs: list[Path]) -> bool:
    """Every rank's warm process has imported TensorFlow and waits."""
    return all(
        out.exists() and any(e.get("event") == "warm" for e in read_events(out)) for out in outs
    )


def waiting_launchers(job_id: str) -> int:
    """The job's warm tasks that wait for their go before they start a child (the
    launchers of ``submit --command``)."""
    count = 0
    for _, argv, items in processes():
        env = dict(item.split(b"=", 1) for item in items if b"=" in item)
        python = Path(argv[0].decode(errors="replace")).name.startswith("python")  # not srun
        ours = env.get(b"SLURM_JOB_ID") == job_id.encode() and b"submitit" in b" ".join(argv)
        count += python and ours and waits(env.get(b"SLURMTF_STANDBY"))
    return count


def kill_warm_and_time(
    pids: list[int], again: Callable[[], bool], state: Callable[[], str],
    report: Callable[[], str],
) -> float:  # fmt: skip
    """SIGKILL ``pids``; the seconds until ``again()``. The job's end before that (its
    ``state()``), or 240 s without it, fails with ``report()``."""
    assert pids, "no training process of rank 1"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(again, 240, "training again after the kill", report,
             running=lambda: state() not in TERMINAL or again())  # fmt: skip
    return time.monotonic() - killed


def tails(paths: list[Path], lines: int = 60) -> str:
    """The last ``lines`` of each of ``paths``, headed by its name."""
    return "".join(f"\n--- {p}:\n{log_tail(p, lines)}" for p in paths)


def check_nothing_warm_left(job_id: str, log_dir: Path, module: str) -> None:
    for rank in (0, 1):
        assert rank_pids(job_id, rank, module) == [], f"rank {rank} left a process"
    assert not list(log_dir.glob("standby-*")), sorted(p.name for p in log_dir.iterdir())


@pytest.mark.matrix
def test_a_killed_rank_of_an_sbatch_job_restarts_on_the_warm_ranks(
    recovery_sandbox: SlurmSandbox, tmp_path: Path
) -> None:
    job = SandboxJob(recovery_sandbox, tmp_path / "sbatch")
    state_home = tmp_path / "state"
    state_home.mkdir()
    job.submit(MODEL, env={**WARM, "XDG_STATE_HOME": str(state_home)})
    try:
        outs = [job.log_dir / f"rank{r}.out" for r in (0, 1)]
        wait_until(job, lambda: warm_ready(outs), 300, "warm ranks ready")
        at_kill = reached(outs[0])
        assert at_kill < STEPS, "the job ended before its warm ranks were ready"
        seconds = kill_warm_and_time(
            rank_pids(job.job_id, 1),
            lambda: trained_after_restart(outs[0]),
            job.state,
            job.report,
        )
        print(f"MEASURED sbatch warm kill -> training again {seconds:.1f} s")
        assert recovery_sandbox.wait(job.job_id, timeout=300) == "COMPLETED", job.report()
        said = job.job_output()
        assert "warm ranks take over" in said, said[-3000:]
        assert seconds < AGAIN_WITHIN_S, job.report()
        check_resumed_from_memory(outs, at_kill, said)
        assert len(final_sums(outs, STEPS)) == 1
        check_status(recovery_sandbox, job.job_id, state_home, STEPS, redone=0)
        check_nothing_warm_left(job.job_id, job.log_dir, "models.mnist")
    finally:
        job.cancel()


def submit_kill_and_check(
    sandbox: SlurmSandbox, tmp_path: Path, target: list[str], *, steps: int, bound: float,
    ready: Callable[[str, list[Path]], bool],
) -> None:  # fmt: skip
    """``slurmtf submit TARGET`` with warm ranks; once ``ready``, rank 1's training process
    is SIGKILLed and the restart must take the warm ranks, resume from rank 0's memory
    within ``bound`` seconds and end COMPLETED with one weights checksum."""
    module = "slurmtf_models.mnist"
    done = sandbox.run(
        [PYTHON, "-m", "slurmtf.submit", "--nodes=2", "--time=10", "--max_restarts=2",
         f"--log_dir={tmp_path}", *target],
        env={"SLURMTF_PORT_BASE": str(free_port_base(2)), **WARM}, cwd=tmp_path, check=False,
    )  # fmt: skip
    found = re.search(r"submitted job (\d+)", done.stdout)
    assert found, done.stdout + done.stderr
    jid = found.group(1)
    try:
        outs = [tmp_path / f"{jid}_{r}_log.out" for r in (0, 1)]

        def report() -> str:
            return tails(sorted(tmp_path.glob(f"{jid}_*"))) + sandbox.logs(jid)

        wait_for(lambda: ready(jid, outs), 300, f"job {jid}: warm ranks ready", report)
        at_kill = reached(outs[0])
        assert at_kill < steps, "the job ended before its warm ranks were ready"
        seconds = kill_warm_and_time(
            rank_pids(jid, 1, module),
            lambda: trained_after_restart(outs[0]),
            lambda: sandbox.state(jid),
            report,
        )
        path = target[0].split("=")[0]
        print(f"MEASURED submit {path} warm kill -> training again {seconds:.1f} s")
        assert sandbox.wait(jid, timeout=300) == "COMPLETED", sandbox.logs(jid)
        said = outs[0].read_text() + sandbox.logs(jid)
        assert "warm ranks take over" in said, said[-3000:]
        assert seconds < bound, said[-3000:]
        check_resumed_from_memory(outs, at_kill, said)
        assert len(final_sums(outs, steps)) == 1
        check_nothing_warm_left(jid, tmp_path, module)
        assert waiting_launchers(jid) == 0
    finally:
        sandbox.run(["scancel", jid], check=False)


@pytest.mark.tf_core
def test_a_killed_rank_of_a_submitted_model_restarts_on_the_warm_ranks(
    recovery_sandbox: SlurmSandbox, tmp_path: Path
) -> None:
    submit_kill_and_check(
        recovery_sandbox, tmp_path, ["--model=mnist", "--", *MODEL], steps=STEPS,
        bound=AGAIN_WITHIN_S, ready=lambda _, outs: warm_ready(outs),
    )  # fmt: skip


def test_a_killed_rank_of_a_submitted_command_restarts_on_the_warm_launchers(
    recovery_sandbox: SlurmSandbox, tmp_path: Path
) -> None:
    # The launchers wait as soon as they start, but a 150-step job can end before that;
    # 600 steps took 250 s of a loaded CI run, 300 leave twice the margin.
    steps = 300
    flags = [f"--train_steps={steps}", *MODEL[1:], f"--model_dir={tmp_path / 'model'}"]
    command = f"{PYTHON} -m slurmtf_models.mnist {' '.join(flags)}"
    submit_kill_and_check(
        recovery_sandbox, tmp_path, [f"--command={command}"], steps=steps,
        bound=COMMAND_AGAIN_WITHIN_S, ready=lambda jid, _: waiting_launchers(jid) == 2,
    )  # fmt: skip
