"""A planned stop of a ``model.fit`` script redoes no step, mid-epoch included: USR2 to
one rank of a 2-worker ``fit`` with :class:`slurmtf.fit.PreemptionCheckpoint` (real
TensorFlow processes in a fake Slurm step on loopback); both ranks stop after the same
batch and exit 75; started again, ``fit`` resumes that epoch at the next batch (the
batches trained before are read and dropped: slurmtf.tf.fit_resume), its first step is
the one after the last trained, and it ends with the weights of the same run
undisturbed, bit for bit (the epoch reads the same data each time). On Keras 3, Keras 2
(TensorFlow 2.15) and tf_keras beside Keras 3 (``TF_USE_LEGACY_KERAS=1``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.helpers.localjobs import Job, wait_for
from tests.prereqs import keras_2

pytestmark = [pytest.mark.tf, pytest.mark.slow, pytest.mark.tf_core]

SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "scripts" / "fit_checks.py"
EPOCHS, STEPS = 3, 6
ARGS = ["--mode=preempt", f"--epochs={EPOCHS}", f"--steps={STEPS}"]


def batches_after_an_epoch(job: Job) -> int:
    """Rank 0's batches since its first epoch ended (0 before)."""
    seen, count = False, 0
    for line in job.stdout(0).splitlines():
        seen = seen or '"event": "epoch_end"' in line
        count += seen and '"event": "batch"' in line
    return count


def job(tmp_path: Path, name: str, legacy: bool) -> Job:
    (tmp_path / name).mkdir()
    made = Job(tmp_path / name, 2, name)
    if legacy:  # tf.keras is tf_keras (Keras 2) beside Keras 3
        made.cluster.base_env = {**made.cluster.base_env, "TF_USE_LEGACY_KERAS": "1"}
    return made


@pytest.mark.parametrize(
    "legacy", [False, *([] if keras_2() else [True])], ids=lambda v: "tf_keras" if v else "keras"
)
def test_a_preempted_fit_resumes_mid_epoch_and_ends_as_undisturbed(
    tmp_path: Path, jobs: list[Job], legacy: bool
) -> None:
    calm = job(tmp_path, "calm", legacy)
    jobs.append(calm.start_script(SCRIPT, [*ARGS, f"--model_dir={tmp_path / 'calm-model'}"]))
    model = [*ARGS, f"--model_dir={tmp_path / 'model'}"]
    hit = job(tmp_path, "hit", legacy)
    jobs.append(hit.start_script(SCRIPT, [*model, "--sleep=0.4"]))
    wait_for(lambda: batches_after_an_epoch(hit) >= 2, 300, "the second epoch's batches",
             hit.logs, running=hit.running)  # fmt: skip
    os.kill(hit.procs[1].pid, signal.SIGUSR2)
    assert hit.wait(120) == [75, 75], hit.logs()
    stops = [hit.events(r, "preempted")[-1] for r in (0, 1)]
    assert [(s["epoch"], s["batch"]) for s in stops] == [(stops[0]["epoch"], stops[0]["batch"])] * 2

    again = job(tmp_path, "again", legacy)
    jobs.append(again.start_script(SCRIPT, model))
    assert again.wait(300) == [0, 0], again.logs()
    (start,) = again.events(0, "fit_start")
    epoch, batch = stops[0]["epoch"], stops[0]["batch"] + 1
    expected = (epoch, batch) if batch < STEPS else (epoch + 1, 0)
    assert (start["initial_epoch"], start["initial_batch"]) == expected, (start, stops)
    first = again.events(0, "batch")[0]
    assert first["step"] == stops[0]["step"] + 1, (first, stops)  # no step done twice
    assert first["batch"] == expected[1], first
    assert calm.wait(120) == [0, 0], calm.logs()
    calm_done = [calm.done(r) for r in (0, 1)]
    sums = {d["weights_checksum"] for d in [*calm_done, again.done(0), again.done(1)]}
    assert len(sums) == 1, (calm_done, again.done(0))
