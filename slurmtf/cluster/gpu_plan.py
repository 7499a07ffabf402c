"""Which GPUs each task uses, without ``nvidia-smi``: Slurm's variables only.

One worker per task, and never two workers of a node on one GPU:

* Slurm's per-task binding (``--gpus-per-task``, ``--gpu-bind``) shows up as a
  ``CUDA_VISIBLE_DEVICES`` narrower than the step's GPUs on the node
  (``SLURM_GPUS_ON_NODE``); it is kept.
* When the tasks of a node all see the node's GPUs (``--gres=gpu:N`` or
  ``--gpus-per-node=N`` without a binding), :func:`plan_gpus` gives local task ``i`` of
  ``n`` the ``i``-th of ``n`` equal consecutive shares (by ``SLURM_LOCALID``).
* One task on a node keeps every GPU it sees: one worker, several local replicas.
* Fewer GPUs than tasks, or a ``CUDA_VISIBLE_DEVICES`` that Slurm's variables cannot
  explain, is a one-line :class:`~slurmtf.errors.InputError` naming the variables.

A ps task, and the chief of a ps job (``SLURMTF_JOBS``), use no GPU
(``CUDA_VISIBLE_DEVICES=""``); the other tasks of their node keep their own share.

``SLURMTF_GPU_SPLIT`` changes the policy: ``auto`` (default), ``off`` (keep
``CUDA_VISIBLE_DEVICES`` as found, no checks) or ``force`` (split what is visible by
``SLURM_LOCALID`` even when Slurm does not say which GPUs the node has).
:func:`apply_gpu_split` writes the plan (explicitly, before TensorFlow starts).
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass

from slurmtf.cluster import roles
from slurmtf.cluster.layout import ClusterLayout
from slurmtf.errors import InputError

log = logging.getLogger(__name__)

_ASK_SLURM = (
    "give every task its own GPUs: --gres=gpu:N (or --gpus-per-node=N) with "
    "--ntasks-per-node=N, or --gpus-per-task=1"
)


def split_gpus(visible: Sequence[str], local_id: int, local_tasks: int) -> tuple[str, ...]:
    """The share of local task ``local_id`` out of ``local_tasks`` tasks.

    Each task gets ``len(visible) // local_tasks`` consecutive GPUs (a remainder stays
    unused). Fewer GPUs than tasks is an error: two workers would share a GPU.
    """
    if not 0 <= local_id < local_tasks:
        raise InputError(
            "SLURM_LOCALID", local_id, f"is not in 0..{local_tasks - 1}", "run under srun"
        )
    if not visible:
        return ()
    if len(visible) < local_tasks:
        raise InputError(
            "CUDA_VISIBLE_DEVICES",
            ",".join(visible),
            f"holds {len(visible)} GPU(s) for the {local_tasks} tasks of this node, so "
            "workers would share a GPU",
            f"{_ASK_SLURM}; or SLURMTF_GPU_SPLIT=off to share them on purpose",
        )
    per_task = len(visible) // local_tasks
    return tuple(visible[local_id * per_task : (local_id + 1) * per_task])


@dataclass(frozen=True)
class GpuPlan:
    """This task's GPUs: what ``CUDA_VISIBLE_DEVICES`` becomes and why.

    ``visible`` is ``None`` when the variable stays unset (no GPUs known). ``replicas``
    is the number of local replicas the worker runs: its GPUs, or 1 without GPUs.
    """

    visible: tuple[str, ...] | None
    change: bool
    message: str

    @property
    def replicas(self) -> int:
        return max(1, len(self.visible or ()))

    @property
    def value(self) -> str | None:
        """``CUDA_VISIBLE_DEVICES`` as the task runs with it (``None``: unset)."""
        return None if self.visible is None else ",".join(self.visible)


def plan_gpus(layout: ClusterLayout) -> GpuPlan:
    """Decide this task's ``CUDA_VISIBLE_DEVICES`` (pure); raises when it cannot.

    See the module doc for the rules; ``layout.gpu_split`` holds ``SLURMTF_GPU_SPLIT``.
    """
    current, node, tasks = layout.cuda_visible_devices, layout.node_gpus, layout.local_tasks
    who = f"local task {layout.local_id} of {tasks}"
    fixed = _fixed_plan(layout)
    if fixed is not None:
        return fixed
    source: tuple[str, ...] = current if current is not None else node or ()
    if tasks <= 1:
        note = "the only task on this node keeps every GPU it sees"
        return GpuPlan(source, current is None, f"{note}: {','.join(source)}")
    if layout.gpu_split == "force":
        node = source
    if node is None:
        raise InputError(
            "CUDA_VISIBLE_DEVICES",
            ",".join(source),
            f"is seen by {tasks} tasks on this node and none of SLURM_STEP_GPUS, "
            "SLURM_JOB_GPUS, SLURM_GPUS_ON_NODE says whether it is the node's GPUs or "
            "this task's",
            f"{_ASK_SLURM}; or set SLURMTF_GPU_SPLIT=force to split it by SLURM_LOCALID, "
            "or =off to keep it",
        )
    if len(source) > len(node):
        raise InputError(
            "CUDA_VISIBLE_DEVICES",
            ",".join(source),
            f"lists {len(source)} GPUs but Slurm gave this step {len(node)} on this node "
            "(SLURM_GPUS_ON_NODE)",
            "do not set CUDA_VISIBLE_DEVICES in a Slurm job; or SLURMTF_GPU_SPLIT=off to keep it",
        )
    if len(source) < len(node):
        if len(source) * tasks > len(node):
            raise InputError(
                "CUDA_VISIBLE_DEVICES",
                ",".join(source),
                f"binds {len(source)} GPU(s) to each of the {tasks} tasks of this node, which "
                f"has {len(node)} (SLURM_GPUS_ON_NODE), so workers share a GPU",
                f"{_ASK_SLURM}; or SLURMTF_GPU_SPLIT=off to share them on purpose",
            )
        return GpuPlan(source, False, f"Slurm's per-task binding {','.join(source)}: kept")
    share = split_gpus(source, layout.local_id, tasks)
    spare = len(source) % tasks
    unused = f"; {spare} GPU(s) unused" if spare else ""
    if current == share:
        return GpuPlan(share, False, f"{who} already sees only its share{unused}")
    before = "unset" if current is None else ",".join(current)
    return GpuPlan(
        share, True, f"CUDA_VISIBLE_DEVICES {before} -> {','.join(share)} for {who}{unused}"
    )


def _fixed_plan(layout: ClusterLayout) -> GpuPlan | None:
    """The plans that need no split: policy off, no GPUs, or a role that uses none."""
    current = layout.cuda_visible_devices
    if layout.gpu_split == "off":
        return GpuPlan(current, False, "SLURMTF_GPU_SPLIT=off: CUDA_VISIBLE_DEVICES kept as found")
    if current == ():
        return GpuPlan((), False, "CUDA_VISIBLE_DEVICES hides every GPU: none used")
    if current is None and not layout.node_gpus:
        return GpuPlan(None, False, "Slurm gave no GPUs to this step: none used")
    if not layout.uses_gpus:
        return GpuPlan(
            (),
            True,
            f"{layout.task_type} {layout.task_id} of a ps job uses no GPU: "
            "CUDA_VISIBLE_DEVICES hides them (SLURMTF_GPU_SPLIT=off keeps them)",
        )
    return None


def node_shares(layout: ClusterLayout) -> tuple[tuple[str, ...] | None, ...]:
    """The GPUs of every local task of this node, by local id (``None``: unknown).

    For the ``--explain`` view. This task's entry is its plan; the others follow from
    the same variables: the node's GPUs in order, ``k`` per task, as the split and
    Slurm's ``per_task`` binding assign them (unknown when this task's own binding is
    not in that order, e.g. ``--gpu-bind=map_gpu:...``, or when no plan is possible).
    """
    tasks = max(layout.local_tasks, 1)
    if layout.cuda_visible_devices is None and not layout.node_gpus:
        return ((),) * tasks  # Slurm gave the step no GPUs here
    try:
        own = plan_gpus(layout).visible
    except InputError:
        own = None
    node, current = layout.node_gpus, layout.cuda_visible_devices
    if current is not None and (layout.gpu_split == "force" or len(current) == len(node or ())):
        node = current  # the node's GPUs as CUDA numbers them (cgroups renumber them)
    shares: list[tuple[str, ...] | None] = [None] * tasks
    if own is not None and node is not None and layout.gpu_split != "off":
        per = len(own)
        in_order = 0 < per * tasks <= len(node) and own == _nth(node, layout.local_id, per)
        if not own or in_order:
            shares = [_nth(node, i, per) for i in range(tasks)]
    for rank, local_id in _ranks_here(layout):
        if layout.roles is not None and not roles.uses_gpus(layout.roles[rank], layout.roles):
            shares[local_id] = ()
    shares[layout.local_id] = own
    return tuple(shares)


def _ranks_here(layout: ClusterLayout) -> list[tuple[int, int]]:
    """``(rank, local id)`` of every rank on this task's node."""
    if layout.is_single_worker or layout.gpu_split == "off":
        return []
    local_ids = layout.local_ids()
    here = [r for r, node in enumerate(layout.nodes) if node == layout.node]
    return [(r, local_ids[r]) for r in here if local_ids[r] < max(layout.local_tasks, 1)]


def _nth(ids: Sequence[str], index: int, per: int) -> tuple[str, ...]:
    return tuple(ids[index * per : (index + 1) * per])


def apply_gpu_split(
    layout: ClusterLayout,
    environ: MutableMapping[str, str] = os.environ,
) -> GpuPlan:
    """Write this task's ``CUDA_VISIBLE_DEVICES`` (:func:`plan_gpus`); return the plan.

    Call it before TensorFlow is imported: CUDA reads the variable once. Raises
    :class:`~slurmtf.errors.InputError` when the task would share a GPU or its GPUs
    cannot be told apart; it never overrides Slurm's per-task binding.
    """
    plan = plan_gpus(layout)
    if plan.change and plan.visible is not None:
        environ["CUDA_VISIBLE_DEVICES"] = ",".join(plan.visible)
        log.info(plan.message)
    else:
        log.debug(plan.message)
    return plan
