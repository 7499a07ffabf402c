"""The cluster layout: which node runs each rank, its address and port, and TF_CONFIG.

Pure: :func:`build_layout` turns a :class:`~slurmtf.env.SlurmEnv` into a frozen
:class:`ClusterLayout`, or raises an :class:`~slurmtf.errors.InputError` naming the
variable, its value and a hint. Host order is Slurm's; nothing is ever sorted.
"""

from __future__ import annotations

import itertools
import json
import re
import string
from dataclasses import dataclass
from typing import Any

from slurmtf import ports
from slurmtf.env import SlurmEnv
from slurmtf.errors import InputError
from slurmtf.gpu_ids import node_gpus, parse_split_mode, parse_visible_devices
from slurmtf.hostlists import expand_hostlist, parse_task_counts, short

DISTRIBUTIONS = ("block", "cyclic", "plane", "arbitrary")
LOCAL_HOST = "localhost"
# Every rank needs its own port: a step can have at most this many tasks.
MAX_TASKS = ports.PORT_MAX + 1 - ports.PORT_MIN
_HOST = re.compile(r"[A-Za-z0-9_.-]+")
_SRUN_HINT = "launch the task with srun inside the job, and do not edit Slurm's variables"


@dataclass(frozen=True)
class ClusterLayout:
    """Every rank's node and ``host:port``, and this task's place among them.

    ``workers[r]`` / ``nodes[r]`` belong to rank ``r`` (``SLURM_PROCID``). ``gpus`` are
    the GPUs this task sees (``None`` when nothing says); ``node_gpus`` those Slurm gave
    the step on this node; ``cuda_visible_devices`` the value found at start;
    ``gpu_split`` the policy of :func:`slurmtf.gpus.plan_gpus` (``SLURMTF_GPU_SPLIT``).
    """

    workers: tuple[str, ...]
    nodes: tuple[str, ...]
    task_index: int = 0
    local_id: int = 0
    local_tasks: int = 1
    job_id: str | None = None
    in_slurm: bool = False
    single_worker_reason: str | None = None
    distribution: str = "block"
    port_base: int = ports.DEFAULT_PORT
    address_template: str | None = None
    gpus: tuple[str, ...] | None = None
    node_gpus: tuple[str, ...] | None = None
    cuda_visible_devices: tuple[str, ...] | None = None
    gpu_split: str = "auto"
    restart_count: int = 0
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        hint = "build layouts with slurmtf.resolver.resolve()"
        if not self.workers or len(self.nodes) != len(self.workers):
            raise InputError("workers", len(self.workers), "does not match nodes", hint)
        if not 0 <= self.task_index < len(self.workers):
            raise InputError("task_index", self.task_index, "is out of range", hint)
        if not 0 <= self.local_id < max(self.local_tasks, 1):
            raise InputError("local_id", self.local_id, "is out of range", hint)

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def is_chief(self) -> bool:
        return self.task_index == 0

    @property
    def is_single_worker(self) -> bool:
        return len(self.workers) == 1

    @property
    def node(self) -> str:
        """The node this task runs on."""
        return self.nodes[self.task_index]

    @property
    def address(self) -> str:
        """This task's ``host`` as peers reach it."""
        return self.workers[self.task_index].rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.workers[self.task_index].rpartition(":")[2])

    def local_ids(self) -> tuple[int, ...]:
        """Every rank's index among the ranks of its node (Slurm's ``SLURM_LOCALID``)."""
        seen: dict[str, int] = {}
        ids = []
        for node in self.nodes:
            ids.append(seen.get(node, 0))
            seen[node] = ids[-1] + 1
        return tuple(ids)

    def tf_config(self) -> dict[str, Any]:
        return {
            "cluster": {"worker": list(self.workers)},
            "task": {"type": "worker", "index": self.task_index},
        }

    def tf_config_json(self) -> str:
        """TF_CONFIG as one line of JSON."""
        return json.dumps(self.tf_config())


def build_layout(
    env: SlurmEnv,
    *,
    port_base: int | str | None = None,
    address_template: str | None = None,
    port_base_name: str = "port_base",
    address_template_name: str = "address_template",
) -> ClusterLayout:
    """The layout of the job step described by ``env``; arguments override the env vars."""
    if port_base is None and env.port_base is not None:
        port_base, port_base_name = env.port_base, "SLURMTF_PORT_BASE"
    if address_template is None and env.address_template is not None:
        address_template, address_template_name = env.address_template, "SLURMTF_ADDRESS_TEMPLATE"
    base = None if port_base is None else ports.parse_port_base(port_base, port_base_name)
    if address_template is not None:
        check_address_template(address_template, address_template_name)
    cuda = parse_visible_devices(env.cuda_visible_devices)
    node_ids = node_gpus(env.slurm_gpus, env.slurm_gpus_var, env.gpus_on_node, env.job_gpus)
    common: dict[str, Any] = {
        "job_id": env.job_id,
        "in_slurm": env.in_slurm,
        "address_template": address_template,
        "gpus": cuda if cuda is not None else node_ids,
        "node_gpus": node_ids,
        "cuda_visible_devices": cuda,
        "gpu_split": parse_split_mode(env.gpu_split),
        "restart_count": _count(env.restart_count, "SLURM_RESTART_COUNT"),
        "sources": env.sources,
    }
    key = _port_key(env)
    if env.nodelist is None:
        why = "SLURM_JOB_ID is set but no node list" if env.in_slurm else "not in a Slurm job"
        return _single(base, key, node=LOCAL_HOST, reason=f"{why}: one local worker", common=common)

    hosts, index_of = _hosts(env.nodelist, env.nodelist_var)
    counts = _task_counts(env, len(hosts))
    ntasks = sum(counts)
    task = _procid(env, ntasks)
    dist, ranks = _place(env, hosts, index_of, counts, ntasks)
    me = ranks[task]
    local_id = ranks[:task].count(me)
    _cross_check(env, hosts[me], local_id, task, dist)
    common |= {"distribution": dist, "local_id": local_id, "local_tasks": counts[me]}
    if ntasks == 1:
        return _single(base, key, node=hosts[me], reason="a one-task step", common=common)

    if base is None:
        base = ports.derive_port_base(key, ntasks, env.num_tasks_var)
    else:
        ports.check_port_range(base, ntasks, port_base_name)
    workers = _workers(hosts, ranks, base, address_template)
    nodes = tuple(map(hosts.__getitem__, ranks))
    return ClusterLayout(workers=workers, nodes=nodes, task_index=task, port_base=base, **common)


def _hosts(nodelist: str, name: str) -> tuple[list[str], dict[str, int]]:
    """The nodes of the step in Slurm's order, and each one's index; none twice."""
    hosts = expand_hostlist(nodelist, name=name)
    if not hosts:
        raise InputError(name, nodelist, "lists no node", _SRUN_HINT)
    index_of = {host: i for i, host in enumerate(hosts)}
    if len(index_of) != len(hosts):
        twice = next(h for i, h in enumerate(hosts) if index_of[h] != i)
        raise InputError(name, short(nodelist), f"lists node {twice!r} twice", _SRUN_HINT)
    return hosts, index_of


def _workers(
    hosts: list[str], ranks: list[int], base: int, address_template: str | None
) -> tuple[str, ...]:
    """``address:port`` of every rank (``ranks[r]``: the index of rank r's node)."""
    if address_template is None:
        addresses = hosts
    else:
        addresses = [address_template.format(host=host) for host in hosts]
    prefixes = [f"{address}:" for address in addresses]
    return tuple([f"{prefixes[i]}{base + rank}" for rank, i in enumerate(ranks)])


def check_address_template(template: str, name: str = "SLURMTF_ADDRESS_TEMPLATE") -> None:
    """Accept templates such as ``{host}-ib`` or ``{host}.ib.cluster``, nothing else."""
    hint = "use {host} once or more plus host-name characters, e.g. {host}-ib or {host}.ib.cluster"
    try:
        fields = [part[1:] for part in string.Formatter().parse(template) if part[1] is not None]
    except ValueError as exc:
        raise InputError(name, template, f"is not a valid template ({exc})", hint) from exc
    if not fields:
        raise InputError(name, template, "does not contain {host}", hint)
    for field, spec, conversion in fields:
        if field != "host" or spec or conversion:
            raise InputError(name, template, f"uses {{{field}}}; only {{host}} is known", hint)
    if not _HOST.fullmatch(template.replace("{host}", "node1")):
        raise InputError(name, template, "makes addresses with invalid characters", hint)


def _single(
    base: int | None, key: int | None, *, node: str, reason: str, common: dict[str, Any]
) -> ClusterLayout:
    port = ports.derive_port_base(key, 1) if base is None else base
    return ClusterLayout(
        workers=(f"{LOCAL_HOST}:{port}",),
        nodes=(node,),
        port_base=port,
        single_worker_reason=reason,
        **common,
    )


def _count(text: str | None, name: str, hint: str = _SRUN_HINT) -> int:
    """A non-negative integer variable (0 when unset)."""
    if text is None:
        return 0
    value = text.strip()
    if not value.isascii() or not value.isdigit() or len(value) > 12:
        raise InputError(name, text, "is not a non-negative integer", hint)
    return int(value)


def _port_key(env: SlurmEnv) -> int | None:
    """The job's port key: the het job id for heterogeneous jobs, else the job id."""
    hint = "unset it, or set SLURMTF_PORT_BASE to choose ports yourself"
    if env.het_job_id is not None:
        return _count(env.het_job_id, "SLURM_HET_JOB_ID", hint)
    if env.job_id is not None:
        return _count(env.job_id, "SLURM_JOB_ID", hint)
    return None


def _task_counts(env: SlurmEnv, nnodes: int) -> list[int]:
    if env.tasks_per_node is None:
        raise InputError(
            env.tasks_per_node_var, None, f"is not set while {env.nodelist_var} is", _SRUN_HINT
        )
    counts = parse_task_counts(env.tasks_per_node, name=env.tasks_per_node_var)
    if len(counts) != nnodes:
        raise InputError(
            env.tasks_per_node_var,
            short(env.tasks_per_node),
            f"gives counts for {len(counts)} nodes but {env.nodelist_var} lists {nnodes}",
            _SRUN_HINT,
        )
    total = sum(counts)
    if total == 0:
        raise InputError(env.tasks_per_node_var, env.tasks_per_node, "counts no task", _SRUN_HINT)
    if total > MAX_TASKS:
        raise InputError(
            env.tasks_per_node_var,
            short(env.tasks_per_node),
            f"counts {total} tasks, more than the {MAX_TASKS} distinct ports of a node",
            "run fewer tasks per step",
        )
    if env.num_tasks is not None and _count(env.num_tasks, env.num_tasks_var) != total:
        raise InputError(
            env.num_tasks_var,
            env.num_tasks,
            f"does not match {env.tasks_per_node_var}={short(env.tasks_per_node)!r} "
            f"({total} tasks)",
            _SRUN_HINT,
        )
    return counts


def _procid(env: SlurmEnv, ntasks: int) -> int:
    if env.procid is None:
        if ntasks == 1:
            return 0
        raise InputError(
            "SLURM_PROCID", None, f"is not set in a {ntasks}-task step", "run each task with srun"
        )
    task = _count(env.procid, "SLURM_PROCID", "it must be this task's rank, set by srun")
    if task >= ntasks:
        raise InputError(
            "SLURM_PROCID",
            env.procid,
            f"is not below the number of tasks ({ntasks})",
            f"check {env.tasks_per_node_var} and {env.num_tasks_var}; {_SRUN_HINT}",
        )
    return task


def _place(
    env: SlurmEnv,
    hosts: list[str],
    index_of: dict[str, int],
    counts: list[int],
    ntasks: int,
) -> tuple[str, list[int]]:
    """The distribution's name and each rank's node index, as Slurm places them."""
    text = env.distribution or ""
    head = text.split(",", 1)[0].split(":", 1)[0].strip().lower()
    plane_text = env.plane_size
    if head.startswith("plane="):
        head, plane_text = "plane", head.partition("=")[2]
    if head in {"", "*", "block"}:
        return "block", list(
            itertools.chain.from_iterable(map(itertools.repeat, range(len(counts)), counts))
        )
    if head == "cyclic":
        return "cyclic", _rounds(counts, 1)
    if head == "plane":
        if plane_text is None:
            raise InputError(
                "SLURM_DIST_PLANESIZE", None, "is not set with plane", "run srun -m plane=N"
            )
        size = _count(plane_text, "SLURM_DIST_PLANESIZE", "expect a positive plane size")
        if size < 1:
            raise InputError("SLURM_DIST_PLANESIZE", plane_text, "is zero", "use plane=1 or more")
        return "plane", _rounds(counts, size)
    if head == "arbitrary":
        return "arbitrary", _arbitrary(env, hosts, index_of, counts, ntasks)
    raise InputError(
        "SLURM_DISTRIBUTION",
        text,
        f"has the node distribution {head!r}, which slurmtf cannot place",
        f"use one of {', '.join(DISTRIBUTIONS)} (srun -m block, ...)",
    )


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
        raise InputError(name, path, "is needed by SLURM_DISTRIBUTION=arbitrary", _SRUN_HINT)
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


def _cross_check(env: SlurmEnv, node: str, local_id: int, task: int, dist: str) -> None:
    """Compare the placement with what Slurm told this very task, when it did."""
    hint = (
        f"the step was not laid out as SLURM_DISTRIBUTION={env.distribution or 'block'!s} "
        f"says; {_SRUN_HINT}"
    )
    if env.nodename is not None and env.nodename.strip() != node:
        raise InputError(
            "SLURMD_NODENAME",
            env.nodename,
            f"differs from {node!r}, where {dist} places rank {task}",
            hint,
        )
    if env.localid is not None and _count(env.localid, "SLURM_LOCALID") != local_id:
        raise InputError(
            "SLURM_LOCALID",
            env.localid,
            f"differs from {local_id}, rank {task}'s index on {node} under {dist}",
            hint,
        )
