"""End-to-end: your own training scripts through jobs/train.sbatch on 2 sandbox nodes.

The three examples (Keras 3 ``model.fit`` with only the README lines, tf_keras
``model.fit`` with ``LEGACY_KERAS=1``, and the custom loop of ``slurmtf.train``) and the
``model.fit`` feature script (metrics, validation data, evaluate, predict,
ModelCheckpoint, BackupAndRestore, TensorBoard) are submitted together; each must end,
on every rank, with the weights of a one-worker run of the same script (same global
batch and seed), run meanwhile as a plain process. Then a ``model.fit`` job with
``slurmtf.fit.PreemptionCheckpoint`` gets USR2, exits 75, is requeued and resumes, and
ends with the weights of an uninterrupted run.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import re
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from slurmtf.cluster.ports import free_port_base
from slurmtf.events import read_events
from tests.e2e.conftest import PYTHON, REPO, TERMINAL, SlurmSandbox
from tests.e2e.jobruns import SandboxJob, check_clean_end, submit_job
from tests.prereqs import require

pytestmark = [pytest.mark.slurm, pytest.mark.tf]

FIT_CHECKS = REPO / "tests" / "scripts" / "fit_checks.py"
TUTORIAL = REPO / "examples" / "tf_tutorial.py"
# The tutorial scales its global batch with the workers: 2 x 32 here, 1 x 64 alone.
TUTORIAL_ARGS = ["--per_worker_batch=32"]
TUTORIAL_ONE_WORKER = ["--per_worker_batch=64"]
CUSTOM_ARGS = ["--train_steps=16", "--eval_steps=2", "--num_threads=1", "--seed=1", "--log_every=4"]
SCRIPTS: dict[str, tuple[Path, list[str], dict[str, str]]] = {
    "keras3": (REPO / "examples" / "keras3_fit.py", [], {}),
    "tf_keras": (REPO / "examples" / "tf_keras_fit.py", [], {"LEGACY_KERAS": "1"}),
    "custom": (REPO / "examples" / "custom_loop.py", CUSTOM_ARGS, {}),
    "features": (FIT_CHECKS, [], {}),
    "tutorial": (TUTORIAL, TUTORIAL_ARGS, {}),
    "tutorial_tf_keras": (TUTORIAL, TUTORIAL_ARGS, {"LEGACY_KERAS": "1"}),
}


@dataclass
class Pair:
    """A 2-node sandbox job and the one-worker run of the same script."""

    job: SandboxJob
    reference: subprocess.Popen[str]
    reference_out: Path

    def reference_events(self) -> list[dict[str, Any]]:
        self.reference.wait(timeout=400)
        text = self.reference_out.read_text()
        assert self.reference.returncode == 0, text[-3000:]
        return [json.loads(x) for x in text.splitlines() if x.startswith("{")]


def submit(
    sandbox: SlurmSandbox,
    root: Path,
    name: str,
    script: Path,
    *,
    args: Sequence[str],
    env: dict[str, str],
) -> SandboxJob:
    """``sbatch jobs/train.sbatch SCRIPT ARGS`` on 2 nodes."""
    return submit_job(
        sandbox, root, name, script="train.sbatch", nodes=2, args=[str(script), *args], env=env
    )


def one_worker(
    sandbox: SlurmSandbox,
    root: Path,
    name: str,
    script: Path,
    *,
    args: Sequence[str],
    env: dict[str, str],
) -> tuple[subprocess.Popen[str], Path]:
    """The same script as one plain process: no Slurm variables, a single local worker.
    The tutorial reads TF_CONFIG, so it starts through ``python -m slurmtf.run``, which
    exports a one-worker TF_CONFIG outside Slurm."""
    clean = {k: v for k, v in sandbox.env.items() if not k.startswith(("SLURM", "TF_CONFIG"))}
    if env.get("LEGACY_KERAS") == "1":
        clean["TF_USE_LEGACY_KERAS"] = "1"
    clean["PYTHONPATH"] = str(REPO)
    out = root / f"{name}-one-worker.out"
    launcher = ["-m", "slurmtf.run"] if script == TUTORIAL else []
    if script == TUTORIAL:
        args = TUTORIAL_ONE_WORKER
    with out.open("w") as sink:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [PYTHON, "-u", *launcher, str(script), *args],
            cwd=root, env=clean, stdout=sink, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    return proc, out


def submit_command(
    slurm_sandbox: SlurmSandbox, command: str, logs: Path, cwd: Path, *flags: str
) -> str:
    """``slurmtf submit --command=COMMAND`` on 2 nodes, logs in ``logs``: the job id."""
    done = slurm_sandbox.run(
        [PYTHON, "-m", "slurmtf.submit", "--nodes=2", "--time=10", f"--log_dir={logs}",
         f"--command={command}", *flags],
        env={"SLURMTF_PORT_BASE": str(free_port_base(2))}, cwd=cwd,
    )  # fmt: skip
    found = re.search(r"submitted job (\d+)", done.stdout)
    assert found, done.stdout + done.stderr
    return found.group(1)


def model_dir_args(name: str, root: Path, *, one: bool) -> list[str]:
    """``--model_dir`` for the scripts that write one (the one-worker run: its own)."""
    if name not in ("custom", "features"):
        return []
    return [f"--model_dir={root / (name + ('-1w' if one else '')) / 'model'}"]


@pytest.fixture(scope="module")
def pairs(
    slurm_sandbox: SlurmSandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Pair]]:
    require(importlib.util.find_spec("tensorflow") is not None, "TensorFlow (pip install .[cpu])")
    require(importlib.util.find_spec("tf_keras") is not None, "tf_keras (scripts/setup.sh)")
    require(importlib.util.find_spec("tensorboard") is not None, "tensorboard (scripts/setup.sh)")
    root = tmp_path_factory.mktemp("byo")
    result: dict[str, Pair] = {}
    for name, (script, args, env) in SCRIPTS.items():
        job = submit(
            slurm_sandbox, root, name, script,
            args=[*args, *model_dir_args(name, root, one=False)], env=env,
        )  # fmt: skip
        proc, out = one_worker(
            slurm_sandbox, root, name, script,
            args=[*args, *model_dir_args(name, root, one=True)], env=env,
        )  # fmt: skip
        result[name] = Pair(job, proc, out)
    yield result
    for pair in result.values():
        pair.job.cancel()
        if pair.reference.poll() is None:
            pair.reference.kill()
            pair.reference.wait()


@pytest.fixture(scope="module")
def submitted_tutorials(
    slurm_sandbox: SlurmSandbox, pairs: dict[str, Pair], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, tuple[str, Path]]]:
    """The tutorial script through ``slurmtf submit --command="python SCRIPT"`` (and
    ``--legacy_keras`` for its tf_keras twin) on 2 nodes: job id and log folder."""
    root = tmp_path_factory.mktemp("tutorial-submit")
    made: dict[str, tuple[str, Path]] = {}
    for name, extra in (("tutorial", []), ("tutorial_tf_keras", ["--legacy_keras"])):
        logs = root / name
        command = f"python3 {TUTORIAL} {' '.join(TUTORIAL_ARGS)}"
        made[name] = (submit_command(slurm_sandbox, command, logs, root, *extra), logs)
    yield made
    for job_id, _ in made.values():
        slurm_sandbox.run(["scancel", job_id], check=False)


def final(events: list[dict[str, Any]], event: str = "done") -> dict[str, Any]:
    found = [e for e in events if e.get("event") == event]
    assert found, f"no {event} event in {events}"
    return found[-1]


def check_same_weights(pair: Pair) -> list[dict[str, Any]]:
    """Both ranks end with the one-worker run's weights; returns the ranks' done events."""
    assert pair.job.finish() == "COMPLETED", pair.job.report()
    assert sorted(pair.job.rank_events) == [0, 1], pair.job.report()
    dones = [final(pair.job.rank_events[r]) for r in (0, 1)]
    reference = final(pair.reference_events())
    assert dones[0]["weights_checksum"] == dones[1]["weights_checksum"], dones
    # One all-reduced mean of two half-batch gradients vs one full-batch gradient:
    # equal up to float32 rounding.
    assert math.isclose(
        dones[0]["weights_checksum"], reference["weights_checksum"], rel_tol=1e-6
    ), (dones, reference)
    assert "srun exited 0" in next(pair.job.run_dir.glob("*.out")).read_text()
    return dones


@pytest.mark.tf_core
@pytest.mark.parametrize("name", ["keras3", "tf_keras", "custom", "tutorial", "tutorial_tf_keras"])
def test_example_on_two_nodes_matches_one_worker(pairs: dict[str, Pair], name: str) -> None:
    dones = check_same_weights(pairs[name])
    if name != "custom":
        assert [d["num_workers"] for d in dones] == [2, 2]
    if name.endswith("tf_keras"):
        assert dones[0]["keras"] == "tf_keras"
    if name.startswith("tutorial"):  # through the launcher for unmodified scripts
        job = pairs[name].job
        launches = [final(job.rank_events[r], "launch") for r in (0, 1)]
        assert [x["launcher"] for x in launches] == ["slurmtf.run", "slurmtf.run"]
        # ...which lets the ranks leave together: no "tasks have crashed", a quick end.
        logs = {r: list(job.log_dir.glob(f"rank{r}.*")) for r in (0, 1)}
        check_clean_end(job.sandbox, job.job_id, logs)


@pytest.mark.tf_core
@pytest.mark.parametrize("name", ["tutorial", "tutorial_tf_keras"])
def test_tutorial_script_through_submit_command_matches_one_worker(
    slurm_sandbox: SlurmSandbox,
    pairs: dict[str, Pair],
    submitted_tutorials: dict[str, tuple[str, Path]],
    name: str,
) -> None:
    """``slurmtf submit --command="python SCRIPT"``: the same script, unchanged, on 2 nodes."""
    job_id, logs = submitted_tutorials[name]
    state = slurm_sandbox.wait(job_id, timeout=400)
    texts = {r: (logs / f"{job_id}_{r}_log.out") for r in (0, 1)}
    assert state == "COMPLETED", slurm_sandbox.logs(job_id) + "".join(
        p.read_text(errors="replace")[-2000:] for p in logs.glob("*_log.*") if p.is_file()
    )
    dones = [final(read_events(texts[r])) for r in (0, 1)]
    reference = final(pairs[name].reference_events())
    assert [d["num_workers"] for d in dones] == [2, 2]
    assert dones[0]["weights_checksum"] == dones[1]["weights_checksum"], dones
    assert math.isclose(dones[0]["weights_checksum"], reference["weights_checksum"], rel_tol=1e-6)
    assert dones[0]["keras"] == ("tf_keras" if name.endswith("tf_keras") else "keras3")
    check_clean_end(
        slurm_sandbox, job_id, {r: list(logs.glob(f"{job_id}_{r}_log.*")) for r in (0, 1)}
    )
    if name == "custom":
        clusters = [final(pairs[name].job.rank_events[r], "cluster") for r in (0, 1)]
        assert [c["num_workers"] for c in clusters] == [2, 2]
        assert all(c["synthetic"] is False for c in clusters)
        assert (pairs[name].job.run_dir.parent / "custom" / "model" / "checkpoints").is_dir()


@pytest.mark.tf_core
def test_fit_features_on_two_nodes(pairs: dict[str, Pair]) -> None:
    """fit (metrics, validation), evaluate and predict agree with one worker; only the
    chief writes ModelCheckpoint, BackupAndRestore and TensorBoard files."""
    pair = pairs["features"]
    check_same_weights(pair)
    reference = pair.reference_events()
    for rank in (0, 1):
        events = pair.job.rank_events[rank]
        history = final(events, "fit")["history"]
        expected = final(reference, "fit")["history"]
        assert sorted(history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
        for key, values in history.items():
            assert values == pytest.approx(expected[key], rel=1e-5), key
        evaluated, ref_eval = final(events, "evaluate"), final(reference, "evaluate")
        assert evaluated["loss"] == pytest.approx(ref_eval["loss"], rel=1e-5)
        predicted = final(events, "predict")
        assert predicted["shape"] == [64, 4]
        assert predicted["max_abs_error"] < 1e-5
    model = pair.job.run_dir.parent / "features" / "model"
    assert sorted(p.name for p in (model / "ckpt").iterdir()) == [
        "epoch1.weights.h5", "epoch2.weights.h5", "epoch3.weights.h5"
    ]  # fmt: skip
    # Keras 2 (TensorFlow 2.15's tf.keras) backs up through a checkpoint manager in a
    # folder of the chief's; Keras 3 writes two files.
    keras2 = importlib.metadata.version("keras").startswith("2.")
    backup = ["chief"] if keras2 else ["latest.weights.h5", "training_metadata.json"]
    assert sorted(p.name for p in (model / "backup").iterdir()) == backup
    for split in ("train", "validation"):
        writers = list((model / "tb" / split).glob("events.out.tfevents.*"))
        assert len(writers) == 1, f"not one TensorBoard writer in {split}: {writers}"


def test_preempted_fit_job_requeues_and_resumes(
    slurm_sandbox: SlurmSandbox, pairs: dict[str, Pair], tmp_path: Path
) -> None:
    """USR2 mid-epoch: every rank saves and exits 75 after the same batch, train.sbatch
    requeues, the new run resumes that epoch at the next batch (no step redone) and ends
    with the uninterrupted weights."""
    for pair in pairs.values():  # run alone: the others would slow it down
        pair.job.finish()
        pair.reference.wait(timeout=400)
    args = ["--mode=preempt", "--epochs=6", "--steps=4"]
    env = {"MAX_REQUEUES": "2"}
    job = submit(
        slurm_sandbox, tmp_path, "fitpreempt", FIT_CHECKS,
        args=[*args, "--sleep=0.25", f"--model_dir={tmp_path / 'fitpreempt' / 'model'}"], env=env,
    )  # fmt: skip
    reference, reference_out = one_worker(
        slurm_sandbox, tmp_path, "fitpreempt", FIT_CHECKS,
        args=[*args, f"--model_dir={tmp_path / 'reference'}"], env={},
    )  # fmt: skip
    chief_out = job.log_dir / "rank0.out"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        text = chief_out.read_text(errors="replace") if chief_out.exists() else ""
        if '"epoch": 1}' in text or slurm_sandbox.state(job.job_id) in TERMINAL:
            break
        time.sleep(0.3)
    else:
        slurm_sandbox.run(["scancel", job.job_id], check=False)
        pytest.fail(f"training never finished epoch 2\n{job.report()}")
    slurm_sandbox.run(["scancel", "--signal=USR2", job.job_id])
    assert job.finish() == "COMPLETED", job.report()

    for rank in (0, 1):
        events = job.rank_events[rank]
        starts = [(e["initial_epoch"], e["initial_batch"]) for e in events
                  if e["event"] == "fit_start"]  # fmt: skip
        (preempted,) = [e for e in events if e["event"] == "preempted"]
        assert len(starts) == 2, job.report()
        assert starts[0] == (0, 0)
        # resumed at the batch after the last trained (the next epoch after its last batch)
        epoch, batch = preempted["epoch"], preempted["batch"] + 1
        assert starts[1] == ((epoch, batch) if batch < 4 else (epoch + 1, 0)), job.report()
        assert epoch >= 2, job.report()  # stopped after epoch 1
    job_log = next(job.run_dir.glob("*.out")).read_text()
    assert "requeueing job" in job_log, job_log
    assert f"job {job.job_id} restart 1" in job_log, job_log
    dones = [final(job.rank_events[r]) for r in (0, 1)]
    reference.wait(timeout=400)
    expected = final(
        [json.loads(x) for x in reference_out.read_text().splitlines() if x.startswith("{")]
    )
    for done in dones:
        assert math.isclose(done["weights_checksum"], expected["weights_checksum"], rel_tol=1e-6), (
            dones,
            expected,
        )


OFFICIAL = REPO / "tests" / "scripts" / "official_flags.py"


@pytest.fixture(scope="module")
def official_flag_jobs(
    slurm_sandbox: SlurmSandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, tuple[str, dict[int, Path]]]]:
    """A script that knows the cluster only from ``--worker_hosts``/``--task_index`` on 2
    nodes, through ``CLUSTER_FLAGS=1 sbatch jobs/train.sbatch`` and through ``slurmtf
    submit --cluster_flags --command``: job id and each rank's stdout file."""
    require(importlib.util.find_spec("tensorflow") is not None, "TensorFlow (pip install .[cpu])")
    root = tmp_path_factory.mktemp("official-flags")
    job = submit(slurm_sandbox, root, "sbatch", OFFICIAL, args=[], env={"CLUSTER_FLAGS": "1"})
    logs = root / "submit"
    submitted = submit_command(slurm_sandbox, f"python3 {OFFICIAL}", logs, root, "--cluster_flags")
    yield {
        "train.sbatch": (job.job_id, {r: job.log_dir / f"rank{r}.out" for r in (0, 1)}),
        "submit": (submitted, {r: logs / f"{submitted}_{r}_log.out" for r in (0, 1)}),
    }
    for job_id in (job.job_id, submitted):
        slurm_sandbox.run(["scancel", job_id], check=False)


@pytest.mark.parametrize("how", ["train.sbatch", "submit"])
def test_a_script_that_reads_only_the_cluster_flags_trains_on_two_nodes(
    slurm_sandbox: SlurmSandbox,
    official_flag_jobs: dict[str, tuple[str, dict[int, Path]]],
    how: str,
) -> None:
    job_id, outs = official_flag_jobs[how]
    state = slurm_sandbox.wait(job_id, timeout=400)
    report = slurm_sandbox.logs(job_id) + "".join(
        f"\n--- {p}:\n{p.read_text(errors='replace')[-2000:]}"
        for p in outs[0].parent.glob("*")
        if p.is_file()
    )
    assert state == "COMPLETED", report
    events = {r: read_events(outs[r]) for r in (0, 1)}
    dones = [final(events[r]) for r in (0, 1)]
    assert [d["rank"] for d in dones] == [0, 1], report
    assert [d["num_workers"] for d in dones] == [2, 2], report
    assert dones[0]["weights_checksum"] == dones[1]["weights_checksum"], dones
    # the flags each rank got name the workers slurmtf.run resolved for the step
    workers = final(events[0], "launch")["tf_config"]["cluster"]["worker"]
    assert [d["worker_hosts"] for d in dones] == [",".join(workers)] * 2, dones
    assert len({w.partition(":")[0] for w in workers}) == 2, workers  # two nodes
