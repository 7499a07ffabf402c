"""Preemption at random moments on the sandbox: the same final step and weights, no lost work.

A two-node ``jobs/mnist.sbatch`` run is preempted once at a random step, alternately

* the soft way, as Slurm does before the time limit (``--signal=USR2@...``): every rank
  gets USR2, saves at the same step and exits 75, and the job script requeues the job;
* the hard way, ``scontrol requeue``: Slurm kills every rank (no save) and requeues.

Every run must end COMPLETED at the same step and with the same weights
(``weights_checksum``) as an uninterrupted run with the same seed; the resumed run must
start from a complete checkpoint (TensorFlow replaces the ``checkpoint`` state file
atomically after the data files are written) no more than one checkpoint interval
behind the step reached (none behind for the soft way).

CI runs ``SLURMTF_PREEMPTIONS`` moments (default 1, the soft way: a run killed without a
save and resumed from its last periodic checkpoint with the same weights is what
``test_recovery.py``'s killed rank checks); the full count, both ways::

    scripts/preemption_soak.sh            # 10 moments, SLURMTF_PREEMPT_SEED to vary them
"""

from __future__ import annotations

import os
import random
import re
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import SlurmSandbox
from tests.e2e.jobruns import ARGS, INTERVAL, STEPS, SandboxJob, wait_until
from tests.helpers.localjobs import checkpoint_step

pytestmark = [pytest.mark.slurm, pytest.mark.tf, pytest.mark.slow]

COUNT = int(os.environ.get("SLURMTF_PREEMPTIONS", "1"))
SEED = int(os.environ.get("SLURMTF_PREEMPT_SEED", "2026"))
_rng = random.Random(SEED)
# `scontrol requeue` kills after KillWait (5 s here; TensorFlow ignores the SIGTERM),
# so a hard preemption is aimed early enough to land before the last step.
MOMENTS = [
    (_rng.randint(2, STEPS - 10), "signal") if i % 2 == 0 else (_rng.randint(2, 40), "requeue")
    for i in range(COUNT)
]
RESUMED = re.compile(r"Resumed from checkpoint \S*ckpt-(\d+)")
STEP = re.compile(r" step (\d+)/\d+ ")


def resumes(text: str) -> list[tuple[int, int]]:
    """(last step logged before a resume, checkpoint step resumed from) for each resume."""
    found = []
    last = 0
    for line in text.splitlines():
        step = STEP.search(line)
        if step:
            last = int(step.group(1))
        resumed = RESUMED.search(line)
        if resumed:
            found.append((last, int(resumed.group(1))))
    return found


def check_checkpoints_complete(model_dir: Path) -> None:
    """Every checkpoint the state file lists has its index and data on disk."""
    state = (model_dir / "checkpoints" / "checkpoint").read_text()
    listed = re.findall(r'all_model_checkpoint_paths: "(?:.*/)?(ckpt-\d+)"', state)
    assert listed, state
    for name in listed:
        folder = model_dir / "checkpoints"
        assert (folder / f"{name}.index").is_file(), f"{name}.index missing: {state}"
        assert list(folder.glob(f"{name}.data-*")), f"{name} data missing: {state}"


@pytest.mark.matrix
@pytest.mark.parametrize(
    "case", MOMENTS, ids=[f"{i}-step{m}-{h}" for i, (m, h) in enumerate(MOMENTS)]
)
def test_a_preempted_run_ends_like_an_uninterrupted_one(
    slurm_sandbox: SlurmSandbox,
    baseline: SandboxJob,
    jobs: list[SandboxJob],
    tmp_path: Path,
    case: tuple[int, str],
) -> None:
    moment, how = case
    job = SandboxJob(slurm_sandbox, tmp_path / "run")
    jobs.append(job)
    job.submit(ARGS)
    wait_until(job, lambda: job.progress() >= moment, 300, f"step {moment}")
    if how == "signal":  # what Slurm sends before the time limit (--signal=USR2@...)
        slurm_sandbox.run(["scancel", "--signal=USR2", job.job_id])
    else:
        slurm_sandbox.run(["scontrol", "requeue", job.job_id])
    preempted = time.monotonic()
    assert job.wait(400) == "COMPLETED", job.report()
    print(f"preempted at step >= {moment} ({how}): done {time.monotonic() - preempted:.1f} s later")

    done = [job.events(rank, "done") for rank in (0, 1)]
    finals = [events[-1] for events in done]
    assert [f["step"] for f in finals] == [STEPS, STEPS], job.report()
    assert [f["restart_count"] for f in finals] == [1, 1], job.report()
    assert finals[0]["weights_checksum"] == finals[1]["weights_checksum"], finals

    chief = job.text("rank0.err")
    (before, resumed_from), *more = resumes(chief)
    assert not more, f"resumed more than once: {resumes(chief)}"
    assert finals[0]["start_step"] == resumed_from
    redone = before - resumed_from
    print(f"reached step {before}, resumed from {resumed_from}: {redone} steps redone")
    job_log = job.job_output()
    assert f"job {job.job_id} restart 1 (MAX_RESTARTS=" in job_log, job_log
    if how == "signal":
        assert "requeueing job" in job_log, job_log  # the script requeued it, not Slurm
        saved = done[0][0]
        assert saved["preempted"] is True, done
        assert resumed_from == saved["step"] >= moment, (saved, resumed_from)
        assert redone == 0, chief[-3000:]
    else:
        assert before < STEPS, f"the run finished before the requeue killed it\n{chief[-3000:]}"
        assert 0 <= redone <= INTERVAL, f"{redone} steps redone (interval {INTERVAL})"
    check_checkpoints_complete(job.model_dir)
    assert checkpoint_step(job.model_dir) == STEPS

    assert baseline.wait(400) == "COMPLETED", baseline.report()
    (reference,) = [baseline.events(0, "done")[-1]]
    assert reference["step"] == STEPS
    assert finals[0]["weights_checksum"] == pytest.approx(
        reference["weights_checksum"], rel=1e-9, abs=1e-9
    ), f"resumed {finals[0]}\nstraight {reference}"
