"""Resolve this Slurm task's place in the job: ``resolve()``, TF_CONFIG, explanations.

The library behind ``slurmtf resolve`` / ``python -m slurmtf.resolver`` (front end:
:mod:`slurmtf.cli.resolve`). Imports TensorFlow only in :func:`cluster_resolver`.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING

from slurmtf.cluster.env import read_slurm_env
from slurmtf.cluster.flags import worker_hosts, workers_only
from slurmtf.cluster.gpu_plan import node_shares, plan_gpus
from slurmtf.cluster.layout import ClusterLayout, build_layout
from slurmtf.errors import SlurmtfError

if TYPE_CHECKING:
    from slurmtf.tf.cluster_resolver import SlurmtfClusterResolver

__all__ = [
    "ClusterLayout",
    "cluster_resolver",
    "explain",
    "export_lines",
    "export_tf_config",
    "resolve",
]

log = logging.getLogger(__name__)


def resolve(
    environ: Mapping[str, str] | None = None,
    *,
    port_base: int | str | None = None,
    address_template: str | None = None,
    jobs: str | Mapping[str, int | None] | None = None,
) -> ClusterLayout:
    """The layout of the current Slurm step (``os.environ`` unless ``environ`` is given).

    Outside Slurm, or in a one-task step, a single local worker
    (``layout.is_single_worker``). ``port_base``, ``address_template`` and ``jobs``
    override ``SLURMTF_PORT_BASE``, ``SLURMTF_ADDRESS_TEMPLATE`` and ``SLURMTF_JOBS``.
    ``jobs`` gives ranks roles in order, as TensorFlow's ``SlurmClusterResolver`` does:
    ``{"chief": 1, "ps": 2, "worker": 2}`` or ``"chief:1,ps:2,worker"`` (docs/RESOLVER.md).
    """
    env = read_slurm_env(os.environ if environ is None else environ)
    layout = build_layout(env, port_base=port_base, address_template=address_template, jobs=jobs)
    if layout.single_worker_reason:
        log.info("single worker: %s", layout.single_worker_reason)
    return layout


def export_tf_config(layout: ClusterLayout, environ: MutableMapping[str, str] = os.environ) -> str:
    """Write ``TF_CONFIG`` for ``layout`` into ``environ`` (explicitly); return the JSON."""
    value = layout.tf_config_json()
    environ["TF_CONFIG"] = value
    return value


def cluster_resolver(
    layout: ClusterLayout | None = None, *, keras_fit: bool = True, flat_memory: bool = True
) -> SlurmtfClusterResolver:
    """A TensorFlow ``ClusterResolver`` for ``layout`` (resolved now when not given).

    Imports TensorFlow; use as ``tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=...)``.
    With ``keras_fit`` (and Keras 3 as ``tf.keras``) it also applies
    :func:`slurmtf.tf.keras_compat.enable_multiworker_fit`, so that ``model.fit`` works
    under that strategy (docs/BRING_YOUR_OWN.md). With ``flat_memory`` it applies
    :func:`slurmtf.tf.collectives.reuse_collective_instance_keys`, without which memory
    grows with every collective op a long run executes.
    """
    from slurmtf.tf import install
    from slurmtf.tf.cluster_resolver import SlurmtfClusterResolver

    install.check_release()
    resolver = SlurmtfClusterResolver(resolve() if layout is None else layout)
    if flat_memory:
        from slurmtf.tf.collectives import reuse_collective_instance_keys

        reuse_collective_instance_keys()
    if keras_fit:
        from slurmtf.tf import keras_compat

        if not keras_compat.legacy_keras_selected():
            keras_compat.enable_multiworker_fit()
    return resolver


def export_lines(layout: ClusterLayout) -> str:
    """Shell ``export`` lines (TF_CONFIG and SLURMTF_*), safe for ``eval``.

    ``SLURMTF_WORKER_HOSTS`` (``H1:P1,H2:P2,...``, TensorFlow's official models'
    ``--worker_hosts``) is there unless ranks have ps or evaluator roles."""
    values = {
        "TF_CONFIG": layout.tf_config_json(),
        "SLURMTF_TASK_INDEX": str(layout.task_index),
        "SLURMTF_NUM_WORKERS": str(layout.num_workers),
        "SLURMTF_IS_CHIEF": "1" if layout.is_chief else "0",
        "SLURMTF_TASK_TYPE": layout.task_type,
        "SLURMTF_TASK_ID": str(layout.task_id),
        "SLURMTF_WORKER_ADDRESS": layout.workers[layout.task_index],
        "SLURMTF_WORKER_PORT": str(layout.port),
    }
    if workers_only(layout):  # the official models' --worker_hosts (none in a ps job)
        values["SLURMTF_WORKER_HOSTS"] = worker_hosts(layout)
    return "\n".join(f"export {key}={shlex.quote(value)}" for key, value in values.items())


def explain(layout: ClusterLayout) -> str:
    """A human view: one row per rank (rank, role, node, address, port, local id, GPUs).

    The GPUs are those each rank of this task's node runs with after
    :func:`slurmtf.cluster.gpu_plan.plan_gpus` (``?``: unknown; ``-``: another node).
    """
    lines = [_summary(layout)]
    header = ("", "rank", "role", "node", "address", "port", "local", "gpus")
    rows = [header]
    local_ids = layout.local_ids() if not layout.is_single_worker else (layout.local_id,)
    shares = node_shares(layout)
    for rank, (worker, node) in enumerate(zip(layout.workers, layout.nodes, strict=True)):
        address, _, port = worker.rpartition(":")
        mine = rank == layout.task_index
        here = node == layout.node and local_ids[rank] < len(shares)
        gpus = _gpu_text(shares[local_ids[rank]]) if here else "-"
        role = _role_text(layout, rank)
        rows.append(
            ("*" if mine else "", str(rank), role, node, address, port, str(local_ids[rank]), gpus)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        lines.append(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    lines.append("* = this task; gpus: CUDA_VISIBLE_DEVICES of each rank on this node")
    if layout.port_rule:
        lines.append(f"ports: {layout.port_rule}")
    lines.append(f"gpus: {_gpu_plan_text(layout)}")
    return "\n".join(lines)


def _role_text(layout: ClusterLayout, rank: int) -> str:
    """``worker:1``, plus ``@N`` for the component of a heterogeneous job."""
    role = layout.role_of(rank)
    index = rank if layout.roles is None else layout.roles[:rank].count(role)
    where = "" if layout.components is None else f"@{layout.components[rank]}"
    return f"{role}:{index}{where}"


def _gpu_plan_text(layout: ClusterLayout) -> str:
    try:
        plan = plan_gpus(layout)
    except SlurmtfError as exc:
        return f"cannot decide: {' '.join(str(exc).splitlines())}"
    return f"{plan.message}; {plan.replicas} local replica(s)"


def _summary(layout: ClusterLayout) -> str:
    if layout.is_single_worker:
        head = f"single local worker ({layout.single_worker_reason or 'one task'})"
    else:
        numbers = [int(w.rpartition(":")[2]) for w in layout.workers]
        tasks = ", ".join(_count_text(len(v), k) for k, v in layout.cluster().items())
        components = set(layout.components or ())
        het = f" of {_count_text(len(components), 'het component')}" if components else ""
        head = (
            f"{tasks} on {len(set(layout.nodes))} nodes{het}, "
            f"{layout.distribution} distribution, ports {min(numbers)}..{max(numbers)}"
        )
    job = f"job {layout.job_id}" if layout.job_id else "no job id"
    used = ", ".join(layout.sources) or "no Slurm variables"
    me = f"rank {layout.task_index}, {layout.task_type} {layout.task_id}"
    return f"{head}; {job}; this task: {me} (from {used})"


def _count_text(count: int, role: str) -> str:
    return f"{count} {role}" + ("s" if count != 1 and role != "ps" else "")


def _gpu_text(gpus: tuple[str, ...] | None) -> str:
    if gpus is None:
        return "?"
    return ",".join(gpus) or "none"


if __name__ == "__main__":  # `python -m slurmtf.resolver`, the same as `slurmtf resolve`
    from slurmtf.cli.resolve import main

    sys.exit(main())
