"""srun's flags for a training step, as functions of the job's settings: its tasks and
CPUs (:func:`step_tasks`: the job's own task count, or ``TASKS_PER_NODE`` on each node,
by default one per GPU), each task's GPUs (:func:`gpu_bind`) and Slurm's reserved ports
for the step (:func:`resv_ports`); the job log's line when the tasks share the node's CPUs
(:func:`cpus_note`).
"""

from __future__ import annotations

from collections.abc import Sequence

from slurmtf.cluster.step_flags import SHARE_CPUS, cpu_flags, gpu_bind_flags
from slurmtf.errors import InputError
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.slurm.resv_ports import resv_ports_args


def first_count(text: str) -> int | None:
    """``2(x3),1`` -> 2: Slurm's per-node counts, the first node's."""
    head = text.split("(", 1)[0].split(",", 1)[0]
    return int(head) if head.isdigit() else None


def step_tasks(job: JobSettings, nodes: int) -> tuple[list[str], str]:
    """srun's task flags for a step on ``nodes`` nodes, and the tasks per node ("" when
    the job's own count stands). A job submitted with a task count gets it as Slurm gave
    it, the same count per node on fewer nodes (spares, a node left out); a job without
    one (the job scripts ask none, so that a --nodes=MIN-MAX range gets every node Slurm
    can give) runs TASKS_PER_NODE tasks on each node, by default one per GPU, on the CPUs
    the job has (:func:`slurmtf.cluster.step_flags.cpu_flags`: split, or shared)."""
    if job.ntasks:
        if nodes == job.num_nodes:
            return [], ""
        fixed = first_count(job.ntasks_per_node) or int(job.ntasks) // max(job.num_nodes, 1)
        return _task_flags(nodes, fixed), str(fixed)
    per_node = tasks_per_node(job)
    cpus = cpu_flags(per_node, job.job_cpus_per_node, job.cpus_per_task)
    return [*_task_flags(nodes, per_node), *cpus], str(per_node)


def tasks_per_node(job: JobSettings) -> int:
    """The tasks on each node of a job that asked no task count: ``TASKS_PER_NODE``, else
    one per GPU of the node (one without GPUs)."""
    gpus = int(job.gpus_on_node) if job.gpus_on_node.isdigit() else 0
    per_node = job.tasks_per_node or str(max(gpus, 1))
    if not per_node.isdigit() or int(per_node) < 1:
        raise InputError(
            "TASKS_PER_NODE", per_node, "is not a task count",
            "TASKS_PER_NODE=1 (one worker with all the node's GPUs) or leave it unset "
            "(one per GPU)",
        )  # fmt: skip
    return int(per_node)


def cpus_note(job: JobSettings, tasks: Sequence[str]) -> str:
    """The job log's line when the step's tasks share the node's CPUs (srun
    ``--overcommit``: the job has fewer CPUs a node than tasks), else ""."""
    if SHARE_CPUS not in tasks:
        return ""
    per_node = tasks_per_node(job)
    gpus = int(job.gpus_on_node) if job.gpus_on_node.isdigit() else 0
    more = (
        "sbatch --cpus-per-gpu=N gives each GPU's worker N CPUs"
        if gpus >= per_node
        else f"sbatch --mincpus={per_node} gives each task a CPU"
    )
    return (
        f"{per_node} task(s) per node share the job's CPUs ({job.job_cpus_per_node} per node; "
        f"srun --overcommit). HINT: {more} (or --ntasks-per-node={per_node} "
        "--cpus-per-task=N)"
    )


def _task_flags(nodes: int, per_node: int) -> list[str]:
    return [f"--nodes={nodes}", f"--ntasks-per-node={per_node}", f"--ntasks={nodes * per_node}"]


def gpu_bind(job: JobSettings, per_node: str) -> list[str]:
    """Slurm binds each task to its own GPUs (--gpu-bind=per_task:K, Slurm 21.08+) unless
    the job chose a binding itself (--gpus-per-task, --gpu-bind: SLURM_TRES_BIND /
    SLURM_TRES_PER_TASK from Slurm 23.11, SLURM_GPU_BIND / SLURM_GPUS_PER_TASK before);
    the model checks it (:func:`slurmtf.cluster.step_flags.gpu_bind_flags`)."""
    per = per_node or job.ntasks_per_node or "1"
    tasks = first_count(per)
    return list(gpu_bind_flags(job.slurm, tasks)) if tasks else []


def resv_ports(job: JobSettings, place: Sequence[str], span: int) -> list[str]:
    """``--resv-ports`` for a step placed with ``place`` (srun's node and task flags):
    one port per rank where the cluster's MpiParams=ports range is ``span`` ports
    (slurmtf.slurm.resv_ports), none when the step's task count is not known."""
    counts = [a.removeprefix("--ntasks=") for a in place if a.startswith("--ntasks=")]
    ntasks = counts[-1] if counts else (job.ntasks or str(job.num_nodes))
    if not ntasks.isdigit():
        return []
    return resv_ports_args(int(ntasks), span, job.resv_mode)
