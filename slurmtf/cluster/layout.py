"""The cluster layout: which node runs each rank, its address and port, and TF_CONFIG.

Pure: :func:`build_layout` turns a :class:`~slurmtf.cluster.env.SlurmEnv` into a frozen
:class:`ClusterLayout`, or raises an :class:`~slurmtf.errors.InputError` naming the
variable, its value and a hint. Host order is Slurm's; nothing is ever sorted.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from slurmtf.cluster import ports, roles
from slurmtf.cluster.env import SlurmEnv
from slurmtf.cluster.gpu_ids import node_gpus, parse_split_mode, parse_visible_devices
from slurmtf.cluster.hostlists import expand_hostlist, parse_task_counts, short
from slurmtf.cluster.placement import SRUN_HINT, Placement, local_ids_of, place
from slurmtf.cluster.placement import count as _count
from slurmtf.errors import InputError

LOCAL_HOST = "localhost"
# Every rank needs its own port: a step can have at most this many tasks.
MAX_TASKS = ports.PORT_MAX + 1 - ports.PORT_MIN
_HOST = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class ClusterLayout:
    """Every rank's node and ``host:port``, and this task's place among them.

    ``workers[r]`` / ``nodes[r]`` belong to rank ``r`` (``SLURM_PROCID``). ``gpus`` are
    the GPUs this task sees (``None`` when nothing says); ``node_gpus`` those Slurm gave
    the step on this node; ``cuda_visible_devices`` the value found at start;
    ``gpu_split`` the policy of :func:`slurmtf.cluster.gpu_plan.plan_gpus` (``SLURMTF_GPU_SPLIT``).
    ``roles[r]`` is rank ``r``'s TensorFlow task type (``None``: every rank a worker, the
    default without ``SLURMTF_JOBS``); ``components[r]`` its component of a
    heterogeneous job (``None`` outside one). ``workers`` lists every rank whatever its
    role; :meth:`cluster` groups them by role. ``port_source`` says where the ports come
    from (``fixed``, ``reserved``, ``job``, ``default``: :func:`slurmtf.cluster.ports.plan_ports`)
    and ``port_rule`` how this attempt's follow from the job, the attempt and the rank.
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
    port_source: str = "default"
    port_rule: str = ""
    address_template: str | None = None
    gpus: tuple[str, ...] | None = None
    node_gpus: tuple[str, ...] | None = None
    cuda_visible_devices: tuple[str, ...] | None = None
    gpu_split: str = "auto"
    restart_count: int = 0
    sources: tuple[str, ...] = ()
    roles: tuple[str, ...] | None = None
    components: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        hint = "build layouts with slurmtf.resolver.resolve()"
        if not self.workers or len(self.nodes) != len(self.workers):
            raise InputError("workers", len(self.workers), "does not match nodes", hint)
        if not 0 <= self.task_index < len(self.workers):
            raise InputError("task_index", self.task_index, "is out of range", hint)
        if not 0 <= self.local_id < max(self.local_tasks, 1):
            raise InputError("local_id", self.local_id, "is out of range", hint)
        for name in ("roles", "components"):
            value = getattr(self, name)
            if value is not None and len(value) != len(self.workers):
                raise InputError(name, value, "does not match workers", hint)

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def is_chief(self) -> bool:
        """The ``chief`` task; without one, worker 0 (TensorFlow's rule)."""
        if self.roles is None:
            return self.task_index == 0
        if "chief" in self.roles:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_id == 0

    def role_of(self, rank: int) -> str:
        """Rank ``rank``'s task type (``worker`` unless ``SLURMTF_JOBS`` says otherwise)."""
        return roles.DEFAULT_ROLE if self.roles is None else self.roles[rank]

    @property
    def task_type(self) -> str:
        """This task's TensorFlow task type: ``chief``, ``ps``, ``worker`` or ``evaluator``."""
        return self.role_of(self.task_index)

    @property
    def task_id(self) -> int:
        """This task's index among the tasks of its type."""
        if self.roles is None:
            return self.task_index
        return roles.task_ids(self.roles)[self.task_index]

    @property
    def component(self) -> int | None:
        """This task's component of a heterogeneous job (``None`` outside one)."""
        return None if self.components is None else self.components[self.task_index]

    @property
    def uses_gpus(self) -> bool:
        """False for a ps, and for the chief of a ps job: they get no GPU unless asked."""
        return self.roles is None or roles.uses_gpus(self.task_type, self.roles)

    def cluster(self) -> dict[str, list[str]]:
        """TensorFlow's cluster spec: each role's ``host:port`` list, in rank order."""
        spec: dict[str, list[str]] = {}
        for rank, address in enumerate(self.workers):
            spec.setdefault(self.role_of(rank), []).append(address)
        return spec

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
        return local_ids_of(self.nodes)

    @property
    def port_moves(self) -> bool:
        """Whether a restart gives the ranks other ports (not for a base the user fixed)."""
        return self.port_source != "fixed"

    def tf_config(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster(),
            "task": {"type": self.task_type, "index": self.task_id},
        }

    def tf_config_json(self) -> str:
        """TF_CONFIG as one line of JSON."""
        return json.dumps(self.tf_config())


def build_layout(
    env: SlurmEnv,
    *,
    port_base: int | str | None = None,
    address_template: str | None = None,
    jobs: str | Mapping[str, int | None] | None = None,
    port_base_name: str = "port_base",
    address_template_name: str = "address_template",
    jobs_name: str = "jobs",
) -> ClusterLayout:
    """The layout of the job step described by ``env``; arguments override the env vars.

    ``jobs`` (else ``SLURMTF_JOBS``) gives ranks roles, see :mod:`slurmtf.cluster.roles`.
    """
    if jobs is None and env.jobs is not None:
        jobs, jobs_name = env.jobs, "SLURMTF_JOBS"
    spec = None if jobs is None else roles.parse_jobs(jobs, jobs_name)
    if port_base is None and env.port_base is not None:
        port_base, port_base_name = env.port_base, "SLURMTF_PORT_BASE"
    if address_template is None and env.address_template is not None:
        address_template, address_template_name = env.address_template, "SLURMTF_ADDRESS_TEMPLATE"
    base = None if port_base is None else ports.parse_port_base(port_base, port_base_name)
    if address_template is not None:
        check_address_template(address_template, address_template_name)
    common = _task_values(env, address_template)
    if env.nodelist is None:
        why = "SLURM_JOB_ID is set but no node list" if env.in_slurm else "not in a Slurm job"
        common["roles"] = None if spec is None else roles.assign_roles(spec, 1)
        plan = ports.step_ports(env, (0,), fixed=base, fixed_name=port_base_name)
        return _single(plan, node=LOCAL_HOST, reason=f"{why}: one local worker", common=common)

    step = _place_step(env, env.nodelist, spec)
    common |= step.values
    het = step.values["components"] is not None
    plan = ports.step_ports(
        env, local_ids_of(step.ranks), fixed=base, fixed_name=port_base_name, het=het
    )
    if len(step.ranks) == 1:
        node = step.hosts[step.ranks[step.task]]
        return _single(plan, node=node, reason="a one-task step", common=common)
    workers = _workers(step.hosts, step.ranks, plan.ports, address_template)
    nodes = tuple(map(step.hosts.__getitem__, step.ranks))
    return ClusterLayout(
        workers=workers, nodes=nodes, task_index=step.task, **_port_values(plan), **common
    )


def _port_values(plan: ports.PortPlan) -> dict[str, Any]:
    return {"port_base": plan.ports[0], "port_source": plan.source, "port_rule": plan.rule}


def _task_values(env: SlurmEnv, address_template: str | None) -> dict[str, Any]:
    """The layout's values that need no node list: the job, its GPUs, the restarts."""
    cuda = parse_visible_devices(env.cuda_visible_devices)
    node_ids = node_gpus(env.slurm_gpus, env.slurm_gpus_var, env.gpus_on_node, env.job_gpus)
    return {
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


class _Step(NamedTuple):
    """The step's nodes, each rank's node (an index into them), this task's rank, and
    the layout's values the placement gives."""

    hosts: list[str]
    ranks: tuple[int, ...]
    task: int
    values: dict[str, Any]


def _place_step(env: SlurmEnv, nodelist: str, spec: roles.JobsSpec | None) -> _Step:
    """Place every rank of the step on its node; check this task against Slurm's ids;
    give ranks their roles (from ``spec``, if any)."""
    hosts, index_of = _hosts(nodelist, env.nodelist_var)
    counts = _task_counts(env, len(hosts))
    ntasks = sum(counts)
    task = _procid(env, ntasks)
    placed = place(env, hosts, index_of, counts)
    ranks = placed.ranks
    me = ranks[task]
    local_id = ranks[:task].count(me)
    _cross_check(env, hosts[me], local_id, task, placed)
    values = {
        "distribution": placed.distribution,
        "local_id": local_id,
        "local_tasks": counts[me],
        "components": placed.components,
        "roles": None
        if spec is None
        else roles.assign_roles(spec, ntasks, placed.components, placed.het_size),
    }
    return _Step(hosts, ranks, task, values)


def _hosts(nodelist: str, name: str) -> tuple[list[str], dict[str, int]]:
    """The nodes of the step in Slurm's order, and each one's index; none twice."""
    hosts = expand_hostlist(nodelist, name=name)
    if not hosts:
        raise InputError(name, nodelist, "lists no node", SRUN_HINT)
    index_of = {host: i for i, host in enumerate(hosts)}
    if len(index_of) != len(hosts):
        twice = next(h for i, h in enumerate(hosts) if index_of[h] != i)
        raise InputError(name, short(nodelist), f"lists node {twice!r} twice", SRUN_HINT)
    return hosts, index_of


def _workers(
    hosts: list[str], ranks: Sequence[int], rank_ports: Sequence[int], address_template: str | None
) -> tuple[str, ...]:
    """``address:port`` of every rank (``ranks[r]``: the index of rank r's node)."""
    if address_template is None:
        addresses = hosts
    else:
        addresses = [address_template.format(host=host) for host in hosts]
    prefixes = [f"{address}:" for address in addresses]
    return tuple([f"{prefixes[i]}{rank_ports[rank]}" for rank, i in enumerate(ranks)])


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
    plan: ports.PortPlan, *, node: str, reason: str, common: dict[str, Any]
) -> ClusterLayout:
    return ClusterLayout(
        workers=(f"{LOCAL_HOST}:{plan.ports[0]}",),
        nodes=(node,),
        single_worker_reason=reason,
        **_port_values(plan),
        **common,
    )


def _task_counts(env: SlurmEnv, nnodes: int) -> list[int]:
    if env.tasks_per_node is None:
        raise InputError(
            env.tasks_per_node_var, None, f"is not set while {env.nodelist_var} is", SRUN_HINT
        )
    counts = parse_task_counts(env.tasks_per_node, name=env.tasks_per_node_var)
    if len(counts) != nnodes:
        raise InputError(
            env.tasks_per_node_var,
            short(env.tasks_per_node),
            f"gives counts for {len(counts)} nodes but {env.nodelist_var} lists {nnodes}",
            SRUN_HINT,
        )
    total = sum(counts)
    if total == 0:
        raise InputError(env.tasks_per_node_var, env.tasks_per_node, "counts no task", SRUN_HINT)
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
            SRUN_HINT,
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
            f"check {env.tasks_per_node_var} and {env.num_tasks_var}; {SRUN_HINT}",
        )
    return task


def _cross_check(env: SlurmEnv, node: str, local_id: int, task: int, placed: Placement) -> None:
    """Compare the placement with what Slurm told this very task, when it did."""
    dist = placed.distribution
    if placed.components is not None:
        dist = f"{dist} (within component {placed.components[task]} of the het job)"
    hint = (
        f"the step was not laid out as SLURM_DISTRIBUTION={env.distribution or 'block'!s} "
        f"says; {SRUN_HINT}"
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
