"""What a model tells the training loop (:class:`ModelSpec`) and where this process runs
in the job (:class:`RunInfo`): the values the loop, its phases and the sidecar evaluator
all take."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from slurmtf.cluster.layout import ClusterLayout

# (input_context, per_replica_batch, skip_batches=0) -> dataset of (images, labels),
# batched per replica and repeated; skip_batches positions it after a resume.
DatasetFn = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What a model tells the loop; everything else comes from :class:`TrainConfig`."""

    name: str
    build_model: Callable[[], Any]
    input_shape: tuple[int, ...]
    train_dataset: DatasetFn
    eval_dataset: DatasetFn
    num_train_examples: int
    num_eval_examples: int
    reference_batch: int
    make_optimizer: Callable[[Any], Any]  # learning-rate schedule -> Keras optimizer
    decay_epochs: tuple[int, ...] = ()
    decay_factor: float = 0.1
    warmup_epochs: int = 0  # used when --warmup_steps is not given
    # Non-trainable state each replica updates on its own (per-replica batch-norm
    # statistics): averaged over all replicas before every evaluation and checkpoint, so
    # every rank evaluates, saves and ends with the same weights.
    replica_local_state: bool = False
    # The spec reads its own data (slurmtf.train users): --data_dir and the synthetic-data
    # warning do not apply.
    own_data: bool = False


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """This process in the job: its place (the layout) and the GPUs it runs with."""

    layout: ClusterLayout
    program: str = "slurmtf"  # prefix of the one-line errors (e.g. models.mnist)
    cuda_visible_devices: str | None = None  # as applied by slurmtf.cluster.gpu_plan (None: unset)
    planned_replicas: int = 1  # GPUs this worker keeps (1 without GPUs)
    gpu_plan: str = ""  # why: slurmtf.cluster.gpu_plan.GpuPlan.message

    @property
    def rank(self) -> int:
        return self.layout.task_index

    @property
    def num_workers(self) -> int:
        return self.layout.num_workers

    @property
    def is_chief(self) -> bool:
        return self.layout.is_chief

    @property
    def workers(self) -> tuple[str, ...]:
        return tuple(self.layout.workers)

    @property
    def restart_count(self) -> int:
        return self.layout.restart_count
