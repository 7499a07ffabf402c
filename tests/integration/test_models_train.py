"""The bundled models as real processes: 1 vs 2 workers, resume, preemption, errors.

Every rank is ``python -m models.<name>`` with a fake Slurm step environment (one node
``localhost``, N tasks, its own port per rank), so ranks find each other through
slurmtf's resolver as under ``srun``. Sizes are tiny and TensorFlow gets one thread per
pool: the whole file runs in about two minutes on 2 cores.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.datafiles import write_cifar, write_imagenet, write_mnist
from tests.helpers.localjobs import (
    SINGLE_THREADED,
    Cluster,
    Job,
    checkpoint_step,
    checkpoint_steps,
    checkpoint_values,
    wait_for,
)
from tests.prereqs import keras_2

pytestmark = [pytest.mark.tf, pytest.mark.slow]
# Largest difference allowed between the weights of a 1-worker and a 2-worker run after
# the same steps on the same global batches, relative to each tensor's norm: only the order
# of float32 sums differs. Element by element it is no measure: Adam turns sum-order noise
# in a gradient element near zero into a step of up to the learning rate (measured: 17 of
# 51,200 elements of a conv kernel 1.4e-4 apart on TensorFlow 2.16, the tensor 2.9e-5).
WEIGHT_TOLERANCE = 1e-4


def worst_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> tuple[float, str]:
    """The largest ``|a - b| / |a|`` over the tensors of two checkpoints, and its name."""
    return max(
        (float(np.linalg.norm(a[n] - b[n]) / max(float(np.linalg.norm(a[n])), 1e-12)), n) for n in a
    )


def _reached(job: Job, step: int) -> bool:
    """The chief's progress events show ``step`` done."""
    return any(e["step"] >= step for e in job.events(0, "progress"))


# ---------------------------------------------------------------------- tests


@pytest.mark.tf_core
def test_two_workers_end_with_the_weights_of_one_worker(tmp_path: Path, jobs: list[Job]) -> None:
    """Same global batch and seed: 2 ranks x 8 examples == 1 rank x 16 examples, step by step.

    Trains on tiny MNIST IDX files (the real reader); the loss must fall; only the chief
    writes checkpoints, prints evaluations and exports.
    """
    data = write_mnist(tmp_path / "mnist", n_train=96, n_eval=32)
    common = [
        "--data_dir",
        str(data),
        "--batch_size=16",
        "--train_steps=12",
        "--seed=7",
        "--dropout_rate=0",
        "--learning_rate=0.02",
        "--log_every=4",
        "--eval_steps=2",
    ]
    two = Job(tmp_path, 2, "two").start("mnist", [*common, f"--model_dir={tmp_path / 'm2'}"])
    one = Job(tmp_path, 1, "one").start(
        "mnist", [*common, f"--model_dir={tmp_path / 'm1'}", f"--export_dir={tmp_path / 'export'}"]
    )
    jobs += [two, one]
    assert two.wait() == [0, 0], two.logs()
    assert one.wait() == [0], one.logs()

    done = [two.done(0), two.done(1), one.done(0)]
    assert [d["rank"] for d in done] == [0, 1, 0]
    assert all(d["step"] == 12 for d in done)
    assert done[0]["weights_checksum"] == done[1]["weights_checksum"]  # ranks agree exactly
    assert done[0]["last_loss"] < 0.5 * done[0]["first_loss"], done[0]  # learnable: loss falls
    assert done[0]["first_loss"] == pytest.approx(done[2]["first_loss"], rel=1e-5)

    w2, w1 = checkpoint_values(tmp_path / "m2"), checkpoint_values(tmp_path / "m1")
    assert w1.keys() == w2.keys()
    assert len(w1) > 8  # 4 kernels, 4 biases, Adam's slots, the step
    worst, name = worst_difference(w1, w2)
    assert worst < WEIGHT_TOLERANCE, f"|w1 - w2| / |w1| = {worst} ({name})"

    cluster = two.events(1, "cluster")[0]
    assert cluster["num_workers"] == 2
    assert cluster["strategy"] == "multi_worker_mirrored"
    assert cluster["per_replica_batch"] == 8
    assert two.events(0, "eval")
    assert not two.events(1, "eval")
    assert " I step " in two.stderr(0)
    assert " I step " not in two.stderr(1)  # other ranks stay quiet...
    assert "step 12/12" in (tmp_path / "m2" / "logs" / "rank1.log").read_text()  # ...but log
    assert (tmp_path / "export" / "saved_model.pb").exists()
    assert not list((tmp_path / "m2").glob("checkpoints/*rank1*"))


def test_kill9_then_restart_resumes_at_the_saved_step(tmp_path: Path, jobs: list[Job]) -> None:
    model_dir = tmp_path / "model"
    flags = [
        f"--model_dir={model_dir}",
        "--batch_size=8",
        "--checkpoint_every=5",
        "--log_every=5",
        "--eval_steps=1",
    ]
    run = Job(tmp_path, 1, "killed").start("mnist", [*flags, "--train_steps=100000"])
    jobs.append(run)
    wait_for(
        lambda: len(checkpoint_steps(model_dir)) >= 2, 120, "two checkpoints", run.logs,
        running=run.running,
    )  # fmt: skip
    os.kill(run.procs[0].pid, signal.SIGKILL)
    assert run.procs[0].wait(10) == -signal.SIGKILL
    saved = checkpoint_step(model_dir)
    assert saved is not None
    assert saved % 5 == 0

    again = Job(tmp_path, 1, "again").start("mnist", [*flags, f"--train_steps={saved + 3}"])
    jobs.append(again)
    assert again.wait() == [0], again.logs()
    assert again.done(0)["start_step"] == saved
    assert again.done(0)["step"] == saved + 3
    assert f"Resumed from checkpoint {model_dir}" in again.stderr(0)

    evaluate = Job(tmp_path, 1, "eval").start("mnist", [*flags, "--eval_only"])
    jobs.append(evaluate)
    assert evaluate.wait() == [0], evaluate.logs()
    assert evaluate.events(0, "eval")[0]["step"] == saved + 3


def test_preemption_signal_saves_on_all_ranks_and_exits_75(tmp_path: Path, jobs: list[Job]) -> None:
    """USR2 to ONE rank: both ranks stop after the same step, save, exit 75; a rerun resumes."""
    model_dir = tmp_path / "model"
    flags = [f"--model_dir={model_dir}", "--batch_size=8", "--log_every=5", "--eval_steps=1"]
    job = Job(tmp_path, 2, "preempted").start("mnist", [*flags, "--train_steps=100000"])
    jobs.append(job)
    wait_for(lambda: _reached(job, 10), 120, "step 10", job.logs, running=job.running)
    os.kill(job.procs[1].pid, signal.SIGUSR2)
    assert job.wait(60) == [75, 75], job.logs()
    done = [job.done(0), job.done(1)]
    assert done[0]["preempted"]
    assert done[1]["preempted"]
    assert done[0]["step"] == done[1]["step"]
    step = done[0]["step"]
    assert checkpoint_step(model_dir) == step
    assert "exiting 75" in job.stderr(1)

    rerun = Job(tmp_path, 1, "rerun").start("mnist", [*flags, f"--train_steps={step + 2}"])
    jobs.append(rerun)
    assert rerun.wait() == [0], rerun.logs()
    assert rerun.done(0)["start_step"] == step


def test_batch_size_not_divisible_by_replicas(tmp_path: Path, jobs: list[Job]) -> None:
    job = Job(tmp_path, 2, "batch").start("mnist", ["--batch_size=33", "--train_steps=1"])
    jobs.append(job)
    assert job.wait(120) == [2, 2], job.logs()
    for rank in range(2):
        assert (
            "--batch_size=33: the global batch does not split evenly over 2 replicas. "
            "HINT: use --batch_size=32" in job.stderr(rank)
        )


def test_single_node_strategy_with_two_workers_is_refused(tmp_path: Path, jobs: list[Job]) -> None:
    job = Job(tmp_path, 2, "strategy")  # rank 0 alone: it must fail before awaiting its peer
    job.start("mnist", ["--distribution_strategy=one_device", "--train_steps=1"], ranks=[0])
    jobs.append(job)
    assert job.wait(60) == [2]
    assert "--distribution_strategy='one_device'" in job.stderr(0)
    assert "HINT:" in job.stderr(0)


@pytest.mark.tf_core
@pytest.mark.parametrize("extra", [["--dtype=bf16", "--enable_xla"], ["--dtype=fp16"]])
def test_mixed_precision_builds_and_steps(
    tmp_path: Path, jobs: list[Job], extra: list[str]
) -> None:
    job = Job(tmp_path, 1, "mixed").start(
        "mnist", [*extra, "--batch_size=8", "--train_steps=3", "--eval_steps=1", "--log_every=1"]
    )
    jobs.append(job)
    assert job.wait() == [0], job.logs()
    done = job.done(0)
    assert np.isfinite(done["last_loss"])
    assert job.events(0, "cluster")[0]["dtype"] == extra[0].split("=")[1]
    # an accuracy on synthetic data says so
    assert re.search(r"eval at step 3: .* accuracy [\d.]+ \(SYNTHETIC data\)", job.stderr(0))


def test_resnet20_trains_on_tiny_cifar_files(tmp_path: Path, jobs: list[Job]) -> None:
    data = write_cifar(tmp_path / "cifar", per_file=8)
    job = Job(tmp_path, 1, "r20").start(
        "resnet",
        [
            "--resnet_size=20",
            f"--data_dir={data}",
            "--batch_size=8",
            "--train_steps=3",
            "--log_every=1",
            f"--model_dir={tmp_path / 'm'}",
        ],
    )
    jobs.append(job)
    assert job.wait() == [0], job.logs()
    assert job.events(0, "eval")[0]["examples"] == 8
    assert job.done(0)["step"] == 3


def test_resnet50_trains_on_tiny_imagenet_tfrecords(tmp_path: Path, jobs: list[Job]) -> None:
    """Two workers: counting the records must not start TensorFlow before the strategy."""
    data = write_imagenet(tmp_path / "imagenet", train_files=2, per_file=4)
    job = Job(tmp_path, 2, "r50").start(
        "resnet",
        [
            "--resnet_size=50",
            "--image_size=32",
            f"--data_dir={data}",
            "--batch_size=4",
            "--train_steps=2",
            "--log_every=1",
            "--dtype=bf16",
        ],
    )
    jobs.append(job)
    assert job.wait() == [0, 0], job.logs()
    assert job.events(0, "eval")[0]["examples"] == 4
    assert job.done(0)["step"] == job.done(1)["step"] == 2
    assert job.done(0)["weights_checksum"] == job.done(1)["weights_checksum"]


def test_unknown_flag_is_a_usage_error(tmp_path: Path, jobs: list[Job]) -> None:
    job = Job(tmp_path, 1, "usage").start("resnet", ["--resnet_size=21"])
    jobs.append(job)
    assert job.wait(60) == [2]
    assert "--resnet_size=21: is not a supported depth. HINT: use one of 20, 32" in job.stderr(0)


def test_dead_peer_ends_the_run_with_a_clear_error(tmp_path: Path, jobs: list[Job]) -> None:
    job = Job(tmp_path, 2, "dead")
    job.extra = ["--heartbeat_timeout=20"]  # the survivor may learn of the death by heartbeat
    job.start(
        "mnist", ["--batch_size=8", "--train_steps=100000", "--log_every=5", "--eval_steps=1"]
    )
    jobs.append(job)
    wait_for(lambda: _reached(job, 5), 120, "step 5", job.logs, running=job.running)
    os.kill(job.procs[1].pid, signal.SIGKILL)
    started = time.monotonic()
    assert job.procs[0].wait(90) == 1, job.logs()
    assert time.monotonic() - started < 60
    assert "models.mnist: a peer failed, stalled or timed out" in job.stderr(0)
    assert "HINT: " in job.stderr(0)


def test_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(
    tmp_path: Path, jobs: list[Job]
) -> None:
    """6 steps, stop, 6 more == 12 steps straight: state, data position and the dropout
    masks' random state are restored (Keras 2 cannot restore that one: no dropout there)."""
    common = ["--batch_size=8", "--seed=3", "--eval_steps=1", "--log_every=3",
              *(["--dropout_rate=0"] if keras_2() else [])]  # fmt: skip
    straight = Job(tmp_path, 1, "straight").start(
        "mnist", [*common, "--train_steps=12", f"--model_dir={tmp_path / 'a'}"]
    )
    first = Job(tmp_path, 1, "first").start(
        "mnist", [*common, "--train_steps=6", f"--model_dir={tmp_path / 'b'}"]
    )
    jobs += [straight, first]
    assert straight.wait() == [0], straight.logs()
    assert first.wait() == [0], first.logs()
    second = Job(tmp_path, 1, "second").start(
        "mnist", [*common, "--train_steps=12", f"--model_dir={tmp_path / 'b'}"]
    )
    jobs.append(second)
    assert second.wait() == [0], second.logs()
    assert second.done(0)["start_step"] == 6
    assert second.done(0)["weights_checksum"] == straight.done(0)["weights_checksum"]
    a, b = checkpoint_values(tmp_path / "a"), checkpoint_values(tmp_path / "b")
    assert a.keys() == b.keys()
    worst, name = worst_difference(a, b)
    assert worst < WEIGHT_TOLERANCE, f"|straight - resumed| / |straight| = {worst} ({name})"


@pytest.mark.tf_core
def test_mirrored_replicas_end_with_the_weights_of_one_device(
    tmp_path: Path, jobs: list[Job]
) -> None:
    """One worker, 2 devices (the CPU split with --cpu_replicas, as 2 GPUs would be)."""
    common = [
        "--batch_size=16",
        "--seed=5",
        "--dropout_rate=0",
        "--eval_steps=1",
        "--train_steps=8",
        "--log_every=4",
    ]
    two = Job(tmp_path, 1, "mirrored").start(
        "mnist", [*common, "--cpu_replicas=2", f"--model_dir={tmp_path / 'm2'}"]
    )
    one = Job(tmp_path, 1, "device").start("mnist", [*common, f"--model_dir={tmp_path / 'm1'}"])
    jobs += [two, one]
    assert two.wait() == [0], two.logs()
    assert one.wait() == [0], one.logs()
    cluster = two.events(0, "cluster")[0]
    assert (cluster["strategy"], cluster["replicas"], cluster["per_replica_batch"]) == (
        "mirrored",
        2,
        8,
    )
    a, b = checkpoint_values(tmp_path / "m1"), checkpoint_values(tmp_path / "m2")
    assert a.keys() == b.keys()
    worst, name = worst_difference(a, b)
    assert worst < WEIGHT_TOLERANCE, f"|one device - mirrored| / |one device| = {worst} ({name})"

    bad = Job(tmp_path, 1, "odd").start("mnist", ["--cpu_replicas=2", "--batch_size=15"])
    jobs.append(bad)
    assert bad.wait(60) == [2]
    assert "HINT: use --batch_size=14 (nearest multiple of 2)" in bad.stderr(0)


def test_two_processes_started_by_hand_train_from_the_cluster_flags(
    tmp_path: Path, cluster_factory: Callable[[int], Cluster]
) -> None:
    """Outside Slurm, as TensorFlow's official models: ``--worker_hosts`` and
    ``--task_index`` are the cluster (two plain processes, no Slurm variable)."""
    cluster = cluster_factory(2)
    cluster.in_slurm = False
    cluster.base_env = dict(SINGLE_THREADED)
    hosts = f"{cluster.worker(0)},{cluster.worker(1)}"
    data = write_mnist(tmp_path / "mnist", n_train=64, n_eval=16)
    flags = [f"--data_dir={data}", "--batch_size=16", "--train_steps=6", "--eval_steps=1",
             "--log_every=2", "--heartbeat_timeout=60", f"--worker_hosts={hosts}",
             f"--model_dir={tmp_path / 'model'}"]  # fmt: skip
    ranks = [
        cluster.launch(i, [*flags, f"--task_index={i}"], python_args=("-m", "models.mnist"))
        for i in (0, 1)
    ]
    assert [rank.wait(240) for rank in ranks] == [0, 0], cluster.logs()
    clusters = [rank.events("cluster")[0] for rank in ranks]
    assert [c["rank"] for c in clusters] == [0, 1]
    assert all(c["num_workers"] == 2 for c in clusters), clusters
    assert all(c["workers"] == hosts.split(",") for c in clusters), clusters
    dones = [rank.events("done")[0] for rank in ranks]
    assert dones[0]["step"] == dones[1]["step"] == 6
    assert dones[0]["weights_checksum"] == dones[1]["weights_checksum"], dones
