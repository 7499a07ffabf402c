"""Where Slurm runs each rank of a step: the task distribution, and heterogeneous steps.

Pure: :func:`place` turns the step's nodes and task counts (and, in a heterogeneous
job, each component's nodes) into every rank's node, as Slurm's step layout does.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from slurmtf.cluster.env import HET_NODELIST_VAR, HET_SIZE_VAR, SlurmEnv
from slurmtf.cluster.hostlists import expand_hostlist, short
from slurmtf.errors import InputError

DISTRIBUTIONS = ("block", "cyclic", "plane", "arbitrary")
SRUN_HINT = "launch the task with srun inside the job, and do not edit Slurm's variables"


@dataclass(frozen=True)
class Placement:
    """``ranks[r]``: the index of rank ``r``'s node in the step's node list;
    ``components[r]``: rank ``r``'s component of a heterogeneous job (else ``None``)."""

    distribution: str
    ranks: tuple[int, ...]
    components: tuple[int, ...] | None = None
    het_size: int = 0


def count(text: str | None, name: str, hint: str = SRUN_HINT) -> int:
    """A non-negative integer variable (0 when unset)."""
    if text is None:
        return 0
    value = text.strip()
    if not value.isascii() or not value.isdigit() or len(value) > 12:
        raise InputError(name, text, "is not a non-negative integer", hint)
    return int(value)


def local_ids_of(nodes: Sequence[object]) -> tuple[int, ...]:
    """Each rank's index among the ranks of its node (``nodes[r]``: rank r's node)."""
    seen: dict[object, int] = {}
    ids = []
    for node in nodes:
        ids.append(seen.get(node, 0))
        seen[node] = ids[-1] + 1
    return tuple(ids)


def place(
    env: SlurmEnv,
    hosts: list[str],
    index_of: dict[str, int],
    counts: list[int],
) -> Placement:
    """Every rank's node, as Slurm places the step's tasks.

    In a heterogeneous step (``SLURM_HET_SIZE``) the ranks of component 0 come first,
    then those of component 1, ...; each component's ranks go over that component's
    nodes (``SLURM_JOB_NODELIST_HET_GROUP_N``, in its order) by the distribution, while
    ``SLURM_STEP_TASKS_PER_NODE`` counts per node of the merged ``SLURM_STEP_NODELIST``.
    """
    ntasks = sum(counts)
    dist, size = _distribution(env)
    groups = _het_groups(env, hosts, index_of)
    if dist == "arbitrary":
        ranks = _arbitrary(env, hosts, index_of, counts, ntasks)
        if groups is None:
            return Placement(dist, tuple(ranks))
        owner = {i: k for k, group in enumerate(groups) for i in group}
        return Placement(dist, tuple(ranks), tuple(owner[i] for i in ranks), len(groups))
    if groups is None:
        return Placement(dist, tuple(_order(counts, size)))
    ranks, components = [], []
    for k, group in enumerate(groups):
        local = _order([counts[i] for i in group], size)
        ranks.extend(group[j] for j in local)
        components.extend([k] * len(local))
    return Placement(dist, tuple(ranks), tuple(components), len(groups))


def _distribution(env: SlurmEnv) -> tuple[str, int]:
    """The node-level distribution's name, and its plane size (1 unless plane)."""
    text = env.distribution or ""
    head = text.split(",", 1)[0].split(":", 1)[0].strip().lower()
    plane_text = env.plane_size
    if head.startswith("plane="):
        head, plane_text = "plane", head.partition("=")[2]
    if head in {"", "*", "block"}:
        return "block", 0
    if head in {"cyclic", "arbitrary"}:
        return head, 1
    if head == "plane":
        if plane_text is None:
            raise InputError(
                "SLURM_DIST_PLANESIZE", None, "is not set with plane", "run srun -m plane=N"
            )
        size = count(plane_text, "SLURM_DIST_PLANESIZE", "expect a positive plane size")
        if size < 1:
            raise InputError("SLURM_DIST_PLANESIZE", plane_text, "is zero", "use plane=1 or more")
        return "plane", size
    raise InputError(
        "SLURM_DISTRIBUTION",
        text,
        f"has the node distribution {head!r}, which slurmtf cannot place",
        f"use one of {', '.join(DISTRIBUTIONS)} (srun -m block, ...)",
    )


def _order(counts: list[int], size: int) -> list[int]:
    """Each rank's node index: block (``size`` 0), cyclic (1) or plane (``size``)."""
    if size == 0:
        return list(
            itertools.chain.from_iterable(map(itertools.repeat, range(len(counts)), counts))
        )
    return _rounds(counts, size)


def _het_groups(
    env: SlurmEnv, hosts: list[str], index_of: dict[str, int]
) -> list[list[int]] | None:
    """The step's node indices of each component, in the component's order (``None``
    outside a heterogeneous job). Every step node belongs to exactly one component."""
    if env.het_size is None:
        return None
    owner: dict[int, int] = {}
    groups: list[list[int]] = []
    for k, nodelist in enumerate(env.het_nodelists):
        name = HET_NODELIST_VAR.format(k)
        if nodelist is None:
            raise InputError(name, None, f"is not set while {HET_SIZE_VAR} is", SRUN_HINT)
        group = [index_of[h] for h in expand_hostlist(nodelist, name=name) if h in index_of]
        for i in group:
            if owner.get(i) == k:
                raise InputError(name, short(nodelist), f"lists node {hosts[i]!r} twice", SRUN_HINT)
            if i in owner:
                raise InputError(
                    name,
                    short(nodelist),
                    f"shares node {hosts[i]!r} with component {owner[i]}, so slurmtf "
                    "cannot tell which of its tasks belong to which component",
                    "give the components of a heterogeneous job distinct nodes",
                )
            owner[i] = k
        groups.append(group)
    for i, host in enumerate(hosts):
        if i not in owner:
            raise InputError(
                env.nodelist_var,
                short(env.nodelist or ""),
                f"lists {host!r}, which no SLURM_JOB_NODELIST_HET_GROUP_N lists",
                SRUN_HINT,
            )
    return groups


def _rounds(counts: list[int], size: int) -> list[int]:
    """Cyclic (size 1) and plane placement: nodes take ``size`` ranks in turn, in order,
    skipping nodes whose count is used up (Slurm's step layout)."""
    ranks: list[int] = []
    left = list(counts)
    active = [i for i, count in enumerate(counts) if count]
    while active:
        # Whole rounds in which every active node takes `size` ranks, in one go.
        rounds = min(left[i] for i in active) // size
        if rounds:
            ranks.extend(
                itertools.chain.from_iterable(
                    [[i] * size for i in active] * rounds if size > 1 else [active] * rounds
                )
            )
            for i in active:
                left[i] -= rounds * size
        else:  # the last, partial round of the smallest nodes
            for i in active:
                take = min(size, left[i])
                ranks.extend([i] * take)
                left[i] -= take
        active = [i for i in active if left[i]]
    return ranks


def _arbitrary(
    env: SlurmEnv,
    hosts: list[str],
    index_of: dict[str, int],
    counts: list[int],
    ntasks: int,
) -> list[int]:
    """``-m arbitrary``: rank ``r`` runs on line ``r`` of ``SLURM_HOSTFILE``."""
    name, path = "SLURM_HOSTFILE", env.hostfile
    if env.hostfile_text is None:
        raise InputError(name, path, "is needed by SLURM_DISTRIBUTION=arbitrary", SRUN_HINT)
    listed: list[str] = []
    for line in env.hostfile_text.splitlines():
        item = line.split("#", 1)[0].strip()
        if item:
            listed.extend(expand_hostlist(item, name=name))
        if len(listed) >= ntasks:
            break
    if len(listed) < ntasks:
        raise InputError(
            name, path, f"lists {len(listed)} hosts for {ntasks} tasks", "list one host per task"
        )
    ranks = []
    for host in listed[:ntasks]:
        if host not in index_of:
            raise InputError(
                name, path, f"lists {host!r}, not in {env.nodelist_var}", "list step nodes only"
            )
        ranks.append(index_of[host])
    placed = [0] * len(hosts)
    for i in ranks:
        placed[i] += 1
    if placed != counts:
        bad = next(i for i, count in enumerate(counts) if placed[i] != count)
        raise InputError(
            name,
            path,
            f"puts {placed[bad]} tasks on {hosts[bad]} but {env.tasks_per_node_var} says "
            f"{counts[bad]}",
            "use the hostfile the step was started with",
        )
    return ranks
