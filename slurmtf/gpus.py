"""Which GPUs a task uses, without ``nvidia-smi``: Slurm's variables only.

* Slurm's per-task binding (``--gpus-per-task``, ``--gres-flags``...) shows up as a
  ``CUDA_VISIBLE_DEVICES`` narrower than the node's GPUs; it is always kept.
* When several tasks of a node share all its GPUs, :func:`apply_gpu_split` (explicit,
  opt-in) gives each local task its share by ``SLURM_LOCALID``. It refuses to change a
  ``CUDA_VISIBLE_DEVICES`` it cannot prove is the node-wide one, unless ``force=True``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slurmtf.errors import InputError

if TYPE_CHECKING:
    from slurmtf.layout import ClusterLayout

log = logging.getLogger(__name__)

_GPU_ID = re.compile(r"[A-Za-z0-9:._/-]+")
_NO_GPUS = {"", "NoDevFiles", "none", "None"}
# More GPUs than any node has; a larger SLURM_GPUS_ON_NODE is garbage, not a list to build.
MAX_GPUS_PER_NODE = 1024


def parse_gpu_ids(text: str | None, name: str) -> tuple[str, ...] | None:
    """Slurm's GPU list (``0,1`` or UUIDs) as a tuple; ``None`` when unset."""
    if text is None:
        return None
    stripped = text.strip()
    if stripped in _NO_GPUS:
        return ()
    ids = tuple(item.strip() for item in stripped.split(","))
    for item in ids:
        if not _GPU_ID.fullmatch(item):
            raise InputError(
                name,
                text,
                f"has {item!r}, not a GPU index or UUID",
                "expect a comma list such as 0,1 (Slurm sets it; unset it if you set it by hand)",
            )
    return ids


def parse_visible_devices(text: str | None) -> tuple[str, ...] | None:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it: entries up to the first invalid one."""
    if text is None:
        return None
    visible: list[str] = []
    for item in text.split(","):
        entry = item.strip()
        if entry in _NO_GPUS or entry.startswith("-") or not _GPU_ID.fullmatch(entry):
            break
        visible.append(entry)
    return tuple(visible)


def node_gpus(
    slurm_gpus: str | None, slurm_gpus_var: str, gpus_on_node: str | None
) -> tuple[str, ...] | None:
    """The GPUs Slurm gave this step (or job) on this node; ``None`` when Slurm is silent."""
    ids = parse_gpu_ids(slurm_gpus, slurm_gpus_var)
    if ids is not None:
        return ids
    if gpus_on_node is None:
        return None
    text = gpus_on_node.strip()
    if not text.isascii() or not text.isdigit():
        raise InputError(
            "SLURM_GPUS_ON_NODE", gpus_on_node, "is not a count", "expect a number such as 2"
        )
    if int(text) > MAX_GPUS_PER_NODE:
        raise InputError(
            "SLURM_GPUS_ON_NODE",
            gpus_on_node,
            f"is more than {MAX_GPUS_PER_NODE} GPUs on one node",
            "expect the GPU count Slurm set; unset it if you set it by hand",
        )
    return tuple(str(i) for i in range(int(text)))


def split_gpus(visible: Sequence[str], local_id: int, local_tasks: int) -> tuple[str, ...]:
    """The share of local task ``local_id`` out of ``local_tasks`` tasks.

    With at least one GPU per task, each task gets ``len(visible) // local_tasks``
    consecutive GPUs (a remainder stays unused); with fewer GPUs than tasks, tasks share
    them round-robin (task ``i`` gets GPU ``i % len(visible)``).
    """
    if not 0 <= local_id < local_tasks:
        raise InputError(
            "SLURM_LOCALID", local_id, f"is not in 0..{local_tasks - 1}", "run under srun"
        )
    if not visible:
        return ()
    if len(visible) < local_tasks:
        return (visible[local_id % len(visible)],)
    per_task = len(visible) // local_tasks
    return tuple(visible[local_id * per_task : (local_id + 1) * per_task])


@dataclass(frozen=True)
class GpuPlan:
    """What :func:`apply_gpu_split` would do: the GPUs to show and why."""

    visible: tuple[str, ...] | None
    change: bool
    message: str
    refused: bool = False


def plan_gpu_split(layout: ClusterLayout, *, force: bool = False) -> GpuPlan:
    """Decide this task's ``CUDA_VISIBLE_DEVICES`` (pure; see :func:`apply_gpu_split`)."""
    current, node = layout.cuda_visible_devices, layout.node_gpus
    who = f"local task {layout.local_id} of {layout.local_tasks}"
    if layout.local_tasks <= 1:
        return GpuPlan(current, False, "one task on this node: it keeps every GPU it sees")
    if current is not None:
        shown = ",".join(current)
        if not force and node is not None and len(current) < len(node):
            return GpuPlan(
                current, False, f"CUDA_VISIBLE_DEVICES={shown} is Slurm's per-task binding: kept"
            )
        if not force and node is None:
            return GpuPlan(
                current,
                False,
                f"CUDA_VISIBLE_DEVICES={shown} is already set and Slurm does not say which GPUs "
                "the node has, so it is left alone. HINT: pass force=True to split it anyway",
                refused=True,
            )
        source: tuple[str, ...] = current
    elif node is not None:
        source = node
    else:
        return GpuPlan(None, False, "Slurm gave no GPUs to this step: nothing to split")
    share = split_gpus(source, layout.local_id, layout.local_tasks)
    if current == share:
        return GpuPlan(current, False, f"{who} already sees only its share")
    before = "unset" if current is None else ",".join(current)
    return GpuPlan(
        share,
        True,
        f"CUDA_VISIBLE_DEVICES {before} -> {','.join(share) or '(none)'} for {who}",
    )


def apply_gpu_split(
    layout: ClusterLayout,
    environ: MutableMapping[str, str] = os.environ,
    *,
    force: bool = False,
) -> tuple[str, ...] | None:
    """Opt-in: narrow ``CUDA_VISIBLE_DEVICES`` to this task's share; return what it shows.

    Call it before TensorFlow is imported. It never overrides Slurm's per-task binding and
    logs a warning (and changes nothing) when the current value is not provably the
    node-wide one, unless ``force`` is set.
    """
    plan = plan_gpu_split(layout, force=force)
    if plan.refused:
        log.warning(plan.message)
    elif plan.change:
        log.info(plan.message)
    else:
        log.debug(plan.message)
    if plan.change and plan.visible is not None:
        environ["CUDA_VISIBLE_DEVICES"] = ",".join(plan.visible)
    return plan.visible
