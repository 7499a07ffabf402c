"""Resolve this Slurm task's place in the job: ``resolve()``, TF_CONFIG and the CLI.

``python -m slurmtf.resolver`` (or ``slurmtf resolve``) prints the TF_CONFIG JSON of the
current task; ``--explain`` prints the layout as a table and ``--export`` prints shell
``export`` lines for ``eval "$(python -m slurmtf.resolver --export)"``. Bad input exits
with status 2 and one line on stderr. Neither this module nor the CLI imports TensorFlow.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING

from slurmtf.env import read_slurm_env
from slurmtf.errors import SlurmtfError
from slurmtf.gpus import node_shares, plan_gpus
from slurmtf.layout import ClusterLayout, build_layout

if TYPE_CHECKING:
    from slurmtf.tf_resolver import SlurmtfClusterResolver

__all__ = [
    "ClusterLayout",
    "cluster_resolver",
    "explain",
    "export_lines",
    "export_tf_config",
    "main",
    "resolve",
]

log = logging.getLogger(__name__)


def resolve(
    environ: Mapping[str, str] | None = None,
    *,
    port_base: int | str | None = None,
    address_template: str | None = None,
) -> ClusterLayout:
    """The layout of the current Slurm step (``os.environ`` unless ``environ`` is given).

    Outside Slurm, or in a one-task step, a single local worker
    (``layout.is_single_worker``). ``port_base`` and ``address_template`` override
    ``SLURMTF_PORT_BASE`` and ``SLURMTF_ADDRESS_TEMPLATE``.
    """
    env = read_slurm_env(os.environ if environ is None else environ)
    layout = build_layout(env, port_base=port_base, address_template=address_template)
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
    :func:`slurmtf.keras_compat.enable_multiworker_fit`, so that ``model.fit`` works
    under that strategy (docs/BRING_YOUR_OWN.md). With ``flat_memory`` it applies
    :func:`slurmtf.collectives.reuse_collective_instance_keys`, without which memory
    grows with every collective op a long run executes.
    """
    from slurmtf.tf_resolver import SlurmtfClusterResolver

    resolver = SlurmtfClusterResolver(resolve() if layout is None else layout)
    if flat_memory:
        from slurmtf.collectives import reuse_collective_instance_keys

        reuse_collective_instance_keys()
    if keras_fit:
        from slurmtf import keras_compat

        if not keras_compat.legacy_keras_selected():
            keras_compat.enable_multiworker_fit()
    return resolver


def export_lines(layout: ClusterLayout) -> str:
    """Shell ``export`` lines (TF_CONFIG and SLURMTF_*), safe for ``eval``."""
    values = {
        "TF_CONFIG": layout.tf_config_json(),
        "SLURMTF_TASK_INDEX": str(layout.task_index),
        "SLURMTF_NUM_WORKERS": str(layout.num_workers),
        "SLURMTF_IS_CHIEF": "1" if layout.is_chief else "0",
        "SLURMTF_WORKER_ADDRESS": layout.workers[layout.task_index],
        "SLURMTF_WORKER_PORT": str(layout.port),
    }
    return "\n".join(f"export {key}={shlex.quote(value)}" for key, value in values.items())


def explain(layout: ClusterLayout) -> str:
    """A human view: one row per rank (rank, node, address, port, local id, GPUs).

    The GPUs are those each rank of this task's node runs with after
    :func:`slurmtf.gpus.plan_gpus` (``?``: unknown; ``-``: another node).
    """
    lines = [_summary(layout)]
    header = ("", "rank", "node", "address", "port", "local", "gpus")
    rows = [header]
    local_ids = layout.local_ids() if not layout.is_single_worker else (layout.local_id,)
    shares = node_shares(layout)
    for rank, (worker, node) in enumerate(zip(layout.workers, layout.nodes, strict=True)):
        address, _, port = worker.rpartition(":")
        mine = rank == layout.task_index
        here = node == layout.node and local_ids[rank] < len(shares)
        gpus = _gpu_text(shares[local_ids[rank]]) if here else "-"
        rows.append(
            ("*" if mine else "", str(rank), node, address, port, str(local_ids[rank]), gpus)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        lines.append(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    lines.append("* = this task; gpus: CUDA_VISIBLE_DEVICES of each rank on this node")
    lines.append(f"gpus: {_gpu_plan_text(layout)}")
    return "\n".join(lines)


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
        last = layout.port_base + layout.num_workers - 1
        head = (
            f"{layout.num_workers} workers on {len(set(layout.nodes))} nodes, "
            f"{layout.distribution} distribution, ports {layout.port_base}..{last}"
        )
    job = f"job {layout.job_id}" if layout.job_id else "no job id"
    used = ", ".join(layout.sources) or "no Slurm variables"
    return f"{head}; {job}; this task: rank {layout.task_index} (from {used})"


def _gpu_text(gpus: tuple[str, ...] | None) -> str:
    if gpus is None:
        return "?"
    return ",".join(gpus) or "none"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmtf resolve",
        description=(
            "Print TF_CONFIG for this Slurm task (run it under srun). Outside Slurm, or in "
            "a one-task step, the cluster is a single local worker."
        ),
    )
    view = parser.add_mutually_exclusive_group()
    view.add_argument("--explain", action="store_true", help="print the layout as a table instead")
    view.add_argument(
        "--export",
        action="store_true",
        help='print shell export lines, for eval "$(python -m slurmtf.resolver --export)"',
    )
    parser.add_argument(
        "--port_base",
        metavar="PORT",
        help="port of rank 0; rank r uses PORT+r (default: from the job id, or SLURMTF_PORT_BASE)",
    )
    parser.add_argument(
        "--address_template",
        metavar="TEMPLATE",
        help="address of each node, e.g. '{host}-ib' (default: the node name, or "
        "SLURMTF_ADDRESS_TEMPLATE)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log which variables are used")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: exit 0 with the output, or 2 with one line on stderr."""
    args = _parser().parse_args(argv)
    handler = None
    package_log = logging.getLogger("slurmtf")
    if args.verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        package_log.addHandler(handler)
        package_log.setLevel(logging.DEBUG)
    try:
        return _run(args)
    finally:
        if handler is not None:
            package_log.removeHandler(handler)
            package_log.setLevel(logging.NOTSET)


def _run(args: argparse.Namespace) -> int:
    try:
        env = read_slurm_env(os.environ)
        layout = build_layout(
            env,
            port_base=args.port_base,
            address_template=args.address_template,
            port_base_name="--port_base",
            address_template_name="--address_template",
        )
    except SlurmtfError as exc:
        print(" ".join(str(exc).splitlines()), file=sys.stderr)
        return 2
    if args.explain:
        print(explain(layout))
    elif args.export:
        print(export_lines(layout))
    else:
        print(layout.tf_config_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
