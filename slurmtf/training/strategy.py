"""Choose a tf.distribute strategy from the cluster layout and the user's flags.

Several workers -> ``MultiWorkerMirroredStrategy`` through slurmtf's resolver, with RING
collectives on CPU and NCCL on GPUs; one node with several GPUs -> ``MirroredStrategy``;
one GPU -> ``OneDeviceStrategy('/gpu:0')``; no GPU -> ``OneDeviceStrategy('/cpu:0')``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from slurmtf.errors import InputError
from slurmtf.tf import coordination
from slurmtf.tf.collectives import reuse_collective_instance_keys
from slurmtf.tf.join_deadline import JoinDeadline
from slurmtf.tf.keras_distribute import fix_older_keras

log = logging.getLogger(__name__)
EVALUATOR = "evaluator"
# tf.errors raised when a collective or the start loses or waits too long for a peer.
PEER_FAILURES = {"UnavailableError", "DeadlineExceededError", "AbortedError", "CancelledError"}


@dataclasses.dataclass(frozen=True)
class StrategyChoice:
    """What :func:`plan_strategy` decided, before any TensorFlow object exists."""

    kind: str  # off | one_device | mirrored | multi_worker_mirrored
    device: str  # for one_device: /cpu:0 or /gpu:0
    collective: str  # ring | nccl (how replicas reduce)


def plan_strategy(
    mode: str, all_reduce_alg: str, num_workers: int, num_gpus: int
) -> StrategyChoice:
    """Pure choice of strategy; raises InputError for impossible combinations."""
    if all_reduce_alg == "nccl" and num_gpus == 0:
        raise InputError(
            "--all_reduce_alg",
            "nccl",
            "NCCL needs GPUs and this task sees none",
            "use --all_reduce_alg=ring (or auto) on CPU nodes",
        )
    collective = all_reduce_alg if all_reduce_alg != "auto" else ("nccl" if num_gpus else "ring")
    if num_workers > 1:
        if mode not in ("auto", "multi_worker_mirrored"):
            raise InputError(
                "--distribution_strategy",
                mode,
                f"the job has {num_workers} workers, which needs multi_worker_mirrored",
                "use --distribution_strategy=auto, or run a single task (srun -n1)",
            )
        return StrategyChoice("multi_worker_mirrored", "", collective)
    if mode == "auto":
        if num_gpus > 1:
            return StrategyChoice("mirrored", "", collective)
        return StrategyChoice("one_device", "/gpu:0" if num_gpus else "/cpu:0", collective)
    if mode == "one_device":
        return StrategyChoice("one_device", "/gpu:0" if num_gpus else "/cpu:0", collective)
    return StrategyChoice(mode, "", collective)


def make_strategy(
    choice: StrategyChoice,
    layout: Any = None,
    *,
    collective_timeout: float = 0.0,
    heartbeat_timeout: float = 0.0,
    registration_timeout: float = 0.0,
    program: str = "slurmtf",
) -> Any:
    """Build the TensorFlow strategy for ``choice`` (``layout`` for several workers)."""
    import tensorflow as tf

    if choice.kind == "off":
        return tf.distribute.get_strategy()
    fix_older_keras()  # before any model is built under the strategy
    if choice.kind == "one_device":
        return tf.distribute.OneDeviceStrategy(choice.device)
    if choice.kind == "mirrored":
        cross = (
            tf.distribute.NcclAllReduce()
            if choice.collective == "nccl"
            else tf.distribute.HierarchicalCopyAllReduce()
        )
        gpus = tf.config.list_logical_devices("GPU")
        if gpus:
            return tf.distribute.MirroredStrategy([d.name for d in gpus], cross_device_ops=cross)
        cpus = tf.config.list_logical_devices("CPU")  # several only with --cpu_replicas
        return tf.distribute.MirroredStrategy(
            [d.name for d in cpus], cross_device_ops=tf.distribute.ReductionToOneDevice()
        )
    implementation = (
        tf.distribute.experimental.CommunicationImplementation.NCCL
        if choice.collective == "nccl"
        else tf.distribute.experimental.CommunicationImplementation.RING
    )
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementation, timeout_seconds=collective_timeout or None
    )
    reuse_collective_instance_keys()
    if layout is None or layout.num_workers <= 1:
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    from slurmtf.tf.cluster_resolver import SlurmtfClusterResolver

    # The sidecar evaluator (slurmtf.training.sidecar) is no part of the training cluster.
    resolver = SlurmtfClusterResolver(layout, exclude=(EVALUATOR,))
    bounded = True
    if heartbeat_timeout or registration_timeout:
        bounded = coordination.configure(
            resolver.cluster_spec(), heartbeat_timeout, registration_timeout
        )
    deadline = None if bounded else _join_deadline(layout, registration_timeout, program)
    try:
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver, communication_options=options
        )
    finally:
        if deadline is not None:
            deadline.joined()


def _join_deadline(layout: Any, timeout: float, program: str) -> JoinDeadline:
    """slurmtf's own bound on joining, where this TensorFlow has no registration barrier."""
    peers = {
        rank: address
        for rank, address in enumerate(layout.workers)
        if rank != layout.task_index and layout.role_of(rank) != EVALUATOR
    }
    log.info(
        "This TensorFlow has no registration barrier (%s): slurmtf bounds the wait for "
        "the peers itself (--registration_timeout=%g)",
        coordination.REGISTER_BARRIER_FIELD,
        timeout,
    )
    return JoinDeadline(
        rank=layout.task_index, peers=peers, timeout=timeout, program=program
    ).start()


def split_cpu(replicas: int, mode: str, num_workers: int, num_gpus: int) -> str:
    """Split the CPU into ``replicas`` logical devices (``--cpu_replicas``); returns the mode.

    This runs the one-node, several-device path (MirroredStrategy) without GPUs, for
    tests and for trying a multi-GPU configuration on a laptop. Call before TF starts.
    """
    if num_gpus or num_workers > 1 or mode not in ("auto", "mirrored"):
        raise InputError(
            "--cpu_replicas",
            replicas,
            "splits the CPU of a single GPU-less worker for MirroredStrategy only",
            "drop --cpu_replicas, or run one task with --distribution_strategy=auto|mirrored",
        )
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)]
    )
    return "mirrored"


def describe(strategy: Any) -> str:
    """Short name of a strategy object for logs and the cluster event."""
    name = type(strategy).__name__
    return {
        "_DefaultDistributionStrategy": "off",
        "OneDeviceStrategy": "one_device",
        "MirroredStrategy": "mirrored",
        "MultiWorkerMirroredStrategy": "multi_worker_mirrored",
        "CollectiveAllReduceStrategy": "multi_worker_mirrored",
    }.get(name, name)
