"""srun flags of slurmtf's own steps that follow from how the job asked for GPUs and CPUs.

Pure: :class:`~slurmtf.cluster.env.SlurmEnv` values in, srun's words out; the job's
supervisor (:mod:`slurmtf.runtime.job.supervisor`) and ``slurmtf check`` call them. A batch
script of one's own gets them by handing its step to the supervisor
(``exec python3 -m slurmtf job command -- CMD``), never by computing them itself.

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
* **CPUs of a step whose tasks the job did not count** (:func:`cpu_flags`): a job that asks
  no task count (the job scripts, so that ``--nodes=MIN-MAX`` gets every node it can) gets
  the CPUs of one task per node: ``sbatch -N2 --gres=gpu:4`` on a cluster without
  ``DefCpuPerGPU`` has 1 CPU a node on every release, CR_Core or CR_CPU, and srun refuses
  4 tasks there ("More processors requested than permitted"). No ``#SBATCH`` line can ask
  more for every job: ``--cpus-per-gpu`` would replace a site's ``DefCpuPerGPU``, sbatch
  refuses it beside a user's ``-c`` (22.05 and 26.05), and beside ``--gres=none`` 22.05's
  steps fail ("Invalid generic resource") and 26.05 refuses the job. So the step takes
  the CPUs the allocation has: split evenly, or shared (``--overcommit``) when there are
  fewer than its tasks.
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


# srun's flag for more tasks than CPUs on a node: the tasks share them.
SHARE_CPUS = "--overcommit"


def cpu_flags(
    tasks_per_node: int, job_cpus_per_node: str, cpus_per_task: str = ""
) -> tuple[str, ...]:
    """srun's CPU flags for a step of ``tasks_per_node`` tasks on each node of a job that
    asked no task count, from the CPUs Slurm gave it (``SLURM_JOB_CPUS_PER_NODE``,
    ``4(x2),8``: the fewest count) and its ``--cpus-per-task`` (``SLURM_CPUS_PER_TASK``):

    * the tasks fit (tasks x cpus-per-task, 1 when unset): none, as srun would do;
    * a CPU each or more: ``--cpus-per-task=K``, the node's CPUs split evenly (``-c N``
      without a task count gives a node N CPUs: Slurm counts one task a node; from 23.11
      the step would inherit N a task and not fit);
    * fewer CPUs than tasks: ``--overcommit``, the tasks share them (a job that asked no
      CPUs, on a cluster without ``DefCpuPerGPU``, has one CPU a node).

    Nothing outside Slurm (no count)."""
    if not job_cpus_per_node.strip():
        return ()
    least = min(parse_task_counts(job_cpus_per_node, name="SLURM_JOB_CPUS_PER_NODE"))
    each = _count(cpus_per_task) or 1
    if tasks_per_node * each <= least:
        return ()
    if least >= tasks_per_node:
        return (f"--cpus-per-task={least // tasks_per_node}",)
    return (SHARE_CPUS,)


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
