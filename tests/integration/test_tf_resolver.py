"""The TensorFlow adapter: a ClusterResolver that MultiWorkerMirroredStrategy accepts."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from slurmtf.cluster.ports import ensure_port_free
from slurmtf.errors import SlurmtfError
from slurmtf.resolver import cluster_resolver, resolve
from tests.conftest import FakeSlurmEnv
from tests.prereqs import require

pytestmark = pytest.mark.tf

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _tensorflow() -> None:
    require(
        importlib.util.find_spec("tensorflow") is not None, "tensorflow (pip install -e .[cpu])"
    )


@pytest.fixture
def fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An ``nvidia-smi`` first on PATH that leaves a mark when anything runs it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mark = tmp_path / "nvidia-smi-ran"
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return mark


def test_task_is_set_at_construction_and_nothing_shells_out(fake_nvidia_smi: Path) -> None:
    layout = resolve(FakeSlurmEnv.step_vars("node[9-10]", "2(x2)", 3, distribution="cyclic"))
    resolver = cluster_resolver(layout)
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 3, "grpc")
    spec = resolver.cluster_spec().as_dict()
    assert [w.split(":")[0] for w in spec["worker"]] == ["node9", "node10", "node9", "node10"]
    assert resolver.master() == f"grpc://{layout.workers[3]}"
    assert resolver.master("worker", 0, rpc_layer="") == layout.workers[0]
    assert resolver.num_accelerators() == {}  # CPU node, no nvidia-smi
    assert not fake_nvidia_smi.exists()
    with pytest.raises(ValueError, match="no task"):
        resolver.master("ps", 0)


def test_the_workers_leave_the_evaluator_out_of_their_cluster() -> None:
    from slurmtf.tf.cluster_resolver import SlurmtfClusterResolver

    step = FakeSlurmEnv.step_vars("node[1-3]", "1(x3)", 1)
    layout = resolve(step, jobs="worker:2,evaluator:1")
    full = cluster_resolver(layout).cluster_spec().as_dict()
    assert sorted(full) == ["evaluator", "worker"]  # TF_CONFIG for users: the whole cluster
    workers_only = SlurmtfClusterResolver(layout, exclude=("evaluator",))
    assert workers_only.cluster_spec().as_dict() == {"worker": full["worker"]}
    assert (workers_only.task_type, workers_only.task_id) == ("worker", 1)
    with pytest.raises(ValueError, match="no task evaluator:0"):
        workers_only.master("evaluator", 0)


def test_gpus_come_from_the_layout_capped_by_what_tensorflow_sees() -> None:
    layout = resolve(FakeSlurmEnv.step_vars("n[1-2]", "1(x2)", 0, CUDA_VISIBLE_DEVICES="0,1"))
    assert layout.gpus == ("0", "1")
    assert cluster_resolver(layout).num_accelerators() == {}  # CPU wheel: no GPU device


def test_strategy_accepts_a_single_worker(fake_slurm_env: FakeSlurmEnv) -> None:
    import tensorflow as tf

    resolver = cluster_resolver()  # outside Slurm: one local worker
    assert resolver.layout.is_single_worker
    assert resolver.cluster_spec().as_dict() == {}
    assert resolver.master() == ""
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    assert strategy.num_replicas_in_sync == 1


WORKER = """
import json, sys
from slurmtf.cluster.ports import ensure_port_free
from slurmtf.resolver import cluster_resolver, resolve

layout = resolve()
ensure_port_free(layout.port)
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster_resolver(layout))
value = strategy.run(lambda: tf.constant(float(layout.task_index + 1)))
total = strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
print(json.dumps({"rank": layout.task_index, "total": float(total),
                  "replicas": strategy.num_replicas_in_sync, "workers": list(layout.workers)}))
"""


def _free_job_id() -> int:
    for _ in range(50):
        job_id = random.randrange(10_000, 10_000_000)
        layout = resolve(FakeSlurmEnv.step_vars("localhost", "2", 0, job_id=job_id))
        try:
            for worker in layout.workers:
                ensure_port_free(int(worker.rpartition(":")[2]), "127.0.0.1")
        except SlurmtfError:
            continue
        return job_id
    raise AssertionError("no free port pair found")


def test_two_workers_on_localhost_all_reduce(fake_nvidia_smi: Path) -> None:
    job_id = _free_job_id()
    procs = []
    for rank in range(2):
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(ROOT),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            **FakeSlurmEnv.step_vars(
                "localhost",
                "2",
                rank,
                job_id=job_id,
                SLURMD_NODENAME="localhost",
                SLURM_LOCALID=rank,
            ),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER],
                env=env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [r["rank"] for r in results] == [0, 1]
    assert [r["total"] for r in results] == [3.0, 3.0]
    assert [r["replicas"] for r in results] == [2, 2]
    assert results[0]["workers"] == results[1]["workers"]
    assert not fake_nvidia_smi.exists()


@pytest.mark.parametrize("rank", range(6))
def test_roles_match_tensorflows_slurm_cluster_resolver(
    fake_slurm_env: FakeSlurmEnv, fake_nvidia_smi: Path, rank: int
) -> None:
    """TensorFlow's own resolver, on a block step it can parse, hands out the same roles;
    TF_CONFIG read back by TensorFlow gives the same cluster and task."""
    import tensorflow as tf
    from tensorflow.python.distribute import multi_worker_util

    jobs = {"chief": 1, "ps": 2, "worker": 3}
    fake_slurm_env.step("n[1-3]", "2(x3)", rank, distribution="block")
    layout = resolve(jobs=jobs)
    resolver = cluster_resolver(layout)
    theirs = tf.distribute.cluster_resolver.SlurmClusterResolver(
        jobs=jobs, port_base=layout.port_base, gpus_per_node=2, gpus_per_task=1, auto_set_gpu=False
    )
    their_spec = theirs.cluster_spec().as_dict()  # sets their task_type/task_id
    assert (resolver.task_type, resolver.task_id) == (theirs.task_type, theirs.task_id)
    ours = resolver.cluster_spec().as_dict()
    assert ours == layout.cluster()
    assert {role: [a.split(":")[0] for a in addresses] for role, addresses in ours.items()} == {
        role: [a.split(":")[0] for a in addresses] for role, addresses in their_spec.items()
    }
    multi_worker_util._validate_cluster_spec(  # TensorFlow's own check
        resolver.cluster_spec(), resolver.task_type, resolver.task_id
    )
    fake_slurm_env.set(TF_CONFIG=layout.tf_config_json())
    from_tf_config = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    assert from_tf_config.cluster_spec().as_dict() == ours
    assert (from_tf_config.task_type, from_tf_config.task_id) == (layout.task_type, layout.task_id)
    assert resolver.master("ps", 1) == f"grpc://{ours['ps'][1]}"
    assert resolver.num_accelerators() == {}
    assert not fake_nvidia_smi.exists()
