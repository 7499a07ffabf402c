"""Where the next step runs: srun's node flags from the recovery decision.

The first step trains on the first N of N+``SPARE_NODES`` nodes (``--nodelist``). After a
node is left out, the next step runs without it (``--exclude``), pinned to the nodes the
decision chose (a spare in its place, or the nodes left), with ``--overlap``: a step on
a hung node stays on Slurm's books, holding the CPUs of every node it ran on, until that
node answers again.
"""

from __future__ import annotations

import dataclasses

from slurmtf.cluster.hostlists import expand_hostlist
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.runtime.job.srun_flags import first_count, step_tasks
from slurmtf.runtime.recovery.decision import Decision
from slurmtf.runtime.recovery.node_choice import Nodes, job_nodes


@dataclasses.dataclass(frozen=True)
class Placement:
    """srun's flags for the nodes (``args``) and the tasks (``tasks``, ``per_node``: the
    job scripts' own count; empty when the job's count stands), the nodes left out so
    far and the first step's nodes (with spares)."""

    args: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    per_node: str = ""
    excluded: tuple[str, ...] = ()
    first: tuple[str, ...] = ()

    @property
    def flags(self) -> tuple[str, ...]:
        """srun's placement flags: the tasks', then the nodes'."""
        return (*self.tasks, *self.args)


def own_tasks(job: JobSettings) -> bool:
    """The job scripts set the step's tasks themselves; a submitit job's srun line has them."""
    return job.kind != "submitit"


def allocated_nodes(job: JobSettings) -> tuple[str, ...]:
    """The job's nodes in Slurm's order (none outside Slurm)."""
    return tuple(expand_hostlist(job.nodelist, name="SLURM_JOB_NODELIST")) if job.nodelist else ()


def every_node(job: JobSettings) -> tuple[str, ...]:
    """Every node of the job: a heterogeneous job's components' too."""
    lists = [text for text in job.slurm.het_nodelists if text] if job.het_size > 1 else []
    if not lists:
        return allocated_nodes(job)
    names = (n for text in lists for n in expand_hostlist(text, name="SLURM_JOB_NODELIST_HET"))
    return tuple(dict.fromkeys(names))


def first_placement(job: JobSettings, minimum: str = "") -> tuple[Nodes, Placement]:
    """The allocation's nodes (with SPARE_NODES and ``minimum``, MIN_NODES or the range's
    minimum Slurm reports, checked) and the first step's placement."""
    nodes = job_nodes(allocated_nodes(job), job.spare_nodes, minimum or job.min_nodes)
    first = nodes.first_step() if nodes.width else ()
    width = len(first) or job.num_nodes
    tasks, per_node = step_tasks(job, width) if own_tasks(job) else ([], "")
    args = (f"--nodelist={','.join(first)}",) if first else ()
    return nodes, Placement(args, tuple(tasks), per_node, (), first)


def next_placement(job: JobSettings, place: Placement, decision: Decision) -> Placement:
    """The next step's placement after a restart in place."""
    if not decision.exclude:  # the same nodes: the first N with spares
        same = (f"--nodelist={','.join(place.first)}",) if place.first else ()
        return dataclasses.replace(place, args=same)
    width = len(decision.nodes) or job.num_nodes
    args = ["--overlap", f"--exclude={','.join(decision.exclude)}"]
    if decision.nodes:
        args.append(f"--nodelist={','.join(decision.nodes)}")
    tasks, per_node = place.tasks, place.per_node
    if own_tasks(job) and place.tasks:
        new, per_node = step_tasks(job, width)
        tasks = tuple(new)
    else:
        args.append(f"--nodes={width}")
        if job.ntasks:
            per = first_count(job.ntasks_per_node) or int(job.ntasks) // max(job.num_nodes, 1)
            args.append(f"--ntasks={width * per}")
    return Placement(tuple(args), tasks, per_node, decision.exclude, place.first)
