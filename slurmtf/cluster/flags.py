"""The cluster as TensorFlow's official models take it: ``--worker_hosts`` and ``--task_index``.

TensorFlow's official ResNet run loop (``configure_cluster`` in its distribution utils)
takes the cluster as two flags, ``--worker_hosts=H1:P1,H2:P2,...`` and ``--task_index=N``,
and builds ``TF_CONFIG`` from them (every host a worker, worker 0 the chief). Pure:

- :func:`cluster_flags`, :func:`worker_hosts`: a layout in that form (``slurmtf resolve
  --flags``, ``--export``'s ``SLURMTF_WORKER_HOSTS``, ``slurmtf run --cluster_flags``);
- :func:`parse_worker_hosts`, :func:`apply_cluster_flags`: the two flags as the layout a
  bundled model runs with: outside Slurm, the cluster they name (two processes started
  by hand on two machines train together); inside a Slurm job, Slurm's layout, which
  the flags must agree with.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

from slurmtf.cluster import ports
from slurmtf.cluster.layout import ClusterLayout
from slurmtf.errors import InputError

WORKER_HOSTS = "--worker_hosts"
TASK_INDEX = "--task_index"
NO_INDEX = -1  # --task_index not given (the official models' default)
# The roles the flag form can name: workers, the first of them the chief.
_FLAG_ROLES = ("chief", "worker")
_HOST = re.compile(r"[A-Za-z0-9_.-]+")
_IN_SLURM_HINT = (
    "inside a Slurm job leave both flags out (slurmtf reads Slurm's variables), or pass "
    "what `slurmtf resolve --flags` prints for the task"
)


def worker_hosts(layout: ClusterLayout) -> str:
    """``H1:P1,H2:P2,...``: every rank's ``host:port`` in rank order."""
    _check_flag_form(layout)
    return ",".join(layout.workers)


def cluster_flags(layout: ClusterLayout) -> list[str]:
    """``[--worker_hosts=H1:P1,..., --task_index=N]`` for this task of ``layout``."""
    return [f"{WORKER_HOSTS}={worker_hosts(layout)}", f"{TASK_INDEX}={layout.task_index}"]


def workers_only(layout: ClusterLayout) -> bool:
    """Whether the flag form can name ``layout``: workers only (worker 0 the chief), no
    ps and no evaluator."""
    if layout.roles is None:
        return True
    chief_not_first = "chief" in layout.roles and layout.roles[0] != "chief"
    return not chief_not_first and not set(layout.roles) - set(_FLAG_ROLES)


def _check_flag_form(layout: ClusterLayout) -> None:
    if layout.roles is not None and not workers_only(layout):
        raise InputError(
            "SLURMTF_JOBS",
            _roles_text(layout.roles),
            "gives ranks roles that --worker_hosts/--task_index cannot name (workers "
            "only, worker 0 the chief)",
            "read TF_CONFIG instead (slurmtf resolve, or its --export lines)",
        )


def _roles_text(roles: tuple[str, ...]) -> str:
    """``chief:1,ps:2,worker:2``: the roles in rank order, counted."""
    return ",".join(f"{role}:{len(list(run))}" for role, run in itertools.groupby(roles))


def parse_worker_hosts(text: str, name: str = WORKER_HOSTS) -> tuple[str, ...]:
    """``H1:P1,H2:P2`` -> ``("H1:P1", "H2:P2")``; one line naming the flag when malformed."""
    hosts = tuple(item.strip() for item in text.split(","))
    hint = "pass comma-separated host:port of every worker, e.g. host1:12345,host2:12345"
    for item in hosts:
        host, colon, port = item.rpartition(":")
        if not colon or not _HOST.fullmatch(host) or not port.isdigit():
            raise InputError(name, text, f"has {item!r}, which is not host:port", hint)
        if not ports.PORT_MIN <= int(port) <= ports.PORT_MAX:
            raise InputError(
                name, text, f"has port {port}, outside {ports.PORT_MIN}..{ports.PORT_MAX}", hint
            )
    twice = [item for i, item in enumerate(hosts) if item in hosts[:i]]
    if twice:
        raise InputError(name, text, f"names {twice[0]} twice", "every worker needs its own port")
    return hosts


def apply_cluster_flags(
    layout: ClusterLayout, hosts_text: str | None, task_index: int = NO_INDEX
) -> ClusterLayout:
    """The layout to run with, given the resolver's ``layout`` and the two flags.

    Neither flag: ``layout``. Inside a Slurm job (``layout.in_slurm``): ``layout``, once
    the flags agree with it. Outside: the cluster the flags name, as TensorFlow's
    official models build it (``--task_index`` may be left out for one host).
    """
    if not hosts_text and task_index == NO_INDEX:
        return layout
    if layout.in_slurm:
        _check_agrees(layout, hosts_text, task_index)
        return layout
    if not hosts_text:
        raise InputError(
            TASK_INDEX,
            task_index,
            "needs --worker_hosts outside a Slurm job",
            "pass --worker_hosts=H1:P1,H2:P2,... too, or neither flag for one local worker",
        )
    if layout.roles is not None:
        raise InputError(
            "SLURMTF_JOBS",
            _roles_text(layout.roles),
            "gives roles, but --worker_hosts names workers only",
            "unset SLURMTF_JOBS when the cluster comes from --worker_hosts",
        )
    return _flags_layout(layout, parse_worker_hosts(hosts_text), task_index)


def _check_agrees(layout: ClusterLayout, hosts_text: str | None, task_index: int) -> None:
    """One line naming the flag, its value and Slurm's when they disagree."""
    slurms = ",".join(layout.workers)
    if hosts_text:
        hosts = parse_worker_hosts(hosts_text)
        same = hosts == layout.workers or (len(hosts) == 1 and layout.is_single_worker)
        if not same:
            raise InputError(
                WORKER_HOSTS,
                hosts_text,
                f"disagrees with Slurm's workers {slurms!r} (from {_sources(layout)})",
                _IN_SLURM_HINT,
            )
    if task_index not in (NO_INDEX, layout.task_index):
        raise InputError(
            TASK_INDEX,
            task_index,
            f"disagrees with Slurm's rank {layout.task_index} for this task (SLURM_PROCID)",
            _IN_SLURM_HINT,
        )


def _sources(layout: ClusterLayout) -> str:
    return ", ".join(name for name in layout.sources if "NODELIST" in name) or "SLURM_JOB_ID"


def _flags_layout(base: ClusterLayout, hosts: tuple[str, ...], task_index: int) -> ClusterLayout:
    """``base`` (a single local worker) with the workers and index the flags name."""
    if task_index == NO_INDEX and len(hosts) == 1:
        task_index = 0  # as the official models: one host needs no index
    if not 0 <= task_index < len(hosts):
        problem = (
            f"is needed with {len(hosts)} --worker_hosts"
            if task_index == NO_INDEX
            else f"is outside 0..{len(hosts) - 1} ({len(hosts)} --worker_hosts)"
        )
        hint = f"pass --task_index=N, this process's place in --worker_hosts (0..{len(hosts) - 1})"
        raise InputError(TASK_INDEX, task_index, problem, hint)
    nodes = tuple(host.rpartition(":")[0] for host in hosts)
    me = nodes[task_index]
    return dataclasses.replace(
        base,
        workers=hosts,
        nodes=nodes,
        task_index=task_index,
        local_id=nodes[:task_index].count(me),
        local_tasks=nodes.count(me),
        port_base=int(hosts[0].rpartition(":")[2]),
        single_worker_reason="one host in --worker_hosts" if len(hosts) == 1 else None,
        sources=(WORKER_HOSTS, TASK_INDEX),
        roles=None,
        components=None,
    )
