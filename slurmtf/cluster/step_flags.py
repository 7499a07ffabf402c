"""srun flags of slurmtf's own steps that follow from how the job asked for GPUs and CPUs.

Pure: :class:`~slurmtf.cluster.env.SlurmEnv` values in, srun's words out; the job's
supervisor (:mod:`slurmtf.runtime.supervisor`) and ``slurmtf check`` call them directly,
``slurmtf step-flags`` prints them for batch scripts of one's own.

* **GPU binding** (:func:`gpu_bind_flags`): the training step asks Slurm to give each task
  its own GPUs (``--gpu-bind=per_task:K``) unless the job chose how its tasks get GPUs
  itself (``--gpu-bind``, ``--gpus-per-task``). Slurm 23.11 and later export that choice
  as ``SLURM_TRES_BIND=gres/gpu:closest`` / ``SLURM_TRES_PER_TASK=gres/gpu=1`` (a
  ``--gpus-per-task`` job gets both: ``gres/gpu:per_task:1``), older releases as
  ``SLURM_GPU_BIND`` / ``SLURM_GPUS_PER_TASK``: the newer names are read first, the older
  as fallback. ``SLURM_TRES_PER_TASK`` also carries ``cpu=N`` (``-c N``): only its
  ``gres/gpu`` part counts as a GPU choice.
* **A step over whole nodes** (:func:`whole_node_environ`): from Slurm 23.11 a step
  inherits the job's ``--cpus-per-task`` (``SLURM_CPUS_PER_TASK``, ``cpu=N`` in
  ``SLURM_TRES_PER_TASK``), which implies ``--exact`` and overrides ``--whole``: a
  one-task-per-node step of a ``-c 2`` job gets 2 CPUs of each node, not the node (22.05
  gave it the node). A step that measures the node runs without those variables, and so
  gets the job's CPUs of each node on every release.
"""

from __future__ import annotations

from collections.abc import Mapping

from slurmtf.cluster.env import SlurmEnv
from slurmtf.cluster.hostlists import parse_task_counts

GPU_TRES = "gres/gpu"


def tres_count(text: str | None, name: str = GPU_TRES, sep: str = ",") -> int | None:
    """How many of TRES ``name`` a Slurm TRES list asks for, summed over types:
    ``gres/gpu=1``, ``gres/gpu:2``, ``cpu=2,gres/gpu:a100:1`` (``None``: not named, or
    no count). ``sep`` separates the entries (``+`` in ``SLURM_TRES_BIND``)."""
    total: int | None = None
    for raw in (text or "").split(sep):
        entry = raw.strip()
        if entry != name and not entry.startswith((f"{name}:", f"{name}=")):
            continue
        count = entry[len(name) + 1 :].replace("=", ":").rsplit(":", 1)[-1]
        if count.isdigit():
            total = (total or 0) + int(count)
    return total


def names_tres(text: str | None, name: str = GPU_TRES, sep: str = "+") -> bool:
    """True when a TRES binding (``gres/gpu:closest+gres/nic:...``) has an entry for ``name``."""
    return any(
        e.strip() == name or e.strip().startswith(f"{name}:") for e in (text or "").split(sep)
    )


def chosen_gpu_binding(env: SlurmEnv) -> tuple[str, str] | None:
    """The variable and value that show the job chose how its tasks get GPUs (its own
    ``--gpu-bind`` or ``--gpus-per-task``), newer names first; ``None`` when it did not."""
    if names_tres(env.tres_bind):
        return "SLURM_TRES_BIND", str(env.tres_bind)
    if env.gpu_bind:
        return "SLURM_GPU_BIND", env.gpu_bind
    if tres_count(env.tres_per_task):
        return "SLURM_TRES_PER_TASK", str(env.tres_per_task)
    if env.gpus_per_task:
        return "SLURM_GPUS_PER_TASK", env.gpus_per_task
    return None


def gpu_bind_flags(env: SlurmEnv, tasks_per_node: int) -> tuple[str, ...]:
    """``--gpu-bind=per_task:K`` (K = the node's GPUs / its tasks) for a step of
    ``tasks_per_node`` tasks on each node when the job chose no binding itself and the
    node has a GPU for each task; else nothing (one task keeps all of the node's GPUs,
    and fewer GPUs than tasks is the model's error to report)."""
    gpus = _count(env.gpus_on_node)
    if chosen_gpu_binding(env) is not None or gpus is None or tasks_per_node < 2:
        return ()
    if gpus < tasks_per_node:
        return ()
    return (f"--gpu-bind=per_task:{gpus // tasks_per_node}",)


# Where a step finds the job's --cpus-per-task: from Slurm 23.11 srun reads both.
CPUS_PER_TASK_VARS = ("SLURM_CPUS_PER_TASK", "SLURM_TRES_PER_TASK")


def whole_node_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` for a step that should get the job's CPUs of each node on every release:
    without ``SLURM_CPUS_PER_TASK`` and the ``cpu=N`` part of ``SLURM_TRES_PER_TASK``, which
    srun inherits from Slurm 23.11 (implying ``--exact``: the step would get N CPUs a task;
    an explicit ``--cpus-per-task`` of the node's count warns "may never run"). Other TRES
    of ``SLURM_TRES_PER_TASK`` (``gres/gpu=1``) stay."""
    out = {k: v for k, v in environ.items() if k not in CPUS_PER_TASK_VARS}
    tres = environ.get("SLURM_TRES_PER_TASK", "")
    kept = [e for e in tres.split(",") if e.strip() and not e.strip().startswith("cpu=")]
    if kept:
        out["SLURM_TRES_PER_TASK"] = ",".join(kept)
    return out


def het_task_counts(environ: Mapping[str, str]) -> dict[str, str]:
    """``SLURM_NTASKS_HET_GROUP_N`` for each component of a heterogeneous job whose batch
    environment lacks it, from its ``SLURM_TASKS_PER_NODE_HET_GROUP_N`` (``2(x3),1`` -> 7).

    A component submitted with ``--ntasks-per-node`` and no ``-n`` has none, and Slurm
    26.05's ``srun --het-group`` then gives it component 0's ``SLURM_NTASKS``: "More
    processors requested than permitted". Exported before that srun, the count is the
    component's own on every release."""
    size = _count(environ.get("SLURM_HET_SIZE")) or 0
    counts = {}
    for group in range(size if size > 1 else 0):
        name = f"SLURM_NTASKS_HET_GROUP_{group}"
        per_node = environ.get(f"SLURM_TASKS_PER_NODE_HET_GROUP_{group}", "").strip()
        if environ.get(name, "").strip() or not per_node:
            continue
        tasks = parse_task_counts(per_node, name=f"SLURM_TASKS_PER_NODE_HET_GROUP_{group}")
        counts[name] = str(sum(tasks))
    return counts


def _count(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) < 8 else None
