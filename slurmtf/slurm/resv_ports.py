"""Slurm's reserved ports: whether a cluster has them and how a step asks for them.

With ``MpiParams=ports=LOW-HIGH`` in slurm.conf, ``srun --resv-ports=N`` reserves ``N``
ports of that range on every node of the step, unique on each node among the steps that
reserved ports (src/common/port_mgr.c); the step's tasks see them as
``SLURM_STEP_RESV_PORTS`` (the resolver's rule: :mod:`slurmtf.cluster.ports`). slurmtf
asks one per rank, so that ranks sharing a network stack differ too. Measured on Slurm
22.05 and read in 26.05's source: a bare ``--resv-ports`` (no count) reserves nothing;
without the option a step gets Slurm's own count (the most tasks of a node plus one); a
count above the range fails the step ("Requires more ports than can be reserved"), so a
bigger step does not ask and takes Slurm's count.

``SLURMTF_RESV_PORTS``: ``auto`` (default: ask when the cluster has ``MpiParams=ports``),
``1`` (ask whatever the configuration says), ``0`` (never ask; the resolver ignores them).
The supervisor of every job (:mod:`slurmtf.runtime.job.supervisor`) asks with this rule;
tests/test_resv_ports.py holds it.
"""

from __future__ import annotations

import re

from slurmtf.errors import SlurmCommandError
from slurmtf.slurm.runner import Runner

_PORTS = re.compile(r"^MpiParams\s*=.*\bports=(\d+)-(\d+)", re.MULTILINE)
# What "ask whatever the configuration says" may ask at most: every port there is.
ANY_SPAN = 65535


def mpi_ports_span(config: str) -> int:
    """How many ports ``MpiParams=ports=LOW-HIGH`` of ``scontrol show config`` offers
    (0 without it)."""
    found = _PORTS.search(config)
    if found is None:
        return 0
    low, high = int(found.group(1)), int(found.group(2))
    return high - low + 1 if 0 < low <= high else 0


def resv_ports_args(ntasks: int, span: int, mode: bool | None) -> list[str]:
    """srun's option for a step of ``ntasks`` ranks: ``--resv-ports=NTASKS`` when asked
    (``mode`` True) or when the cluster offers ``span`` >= ``ntasks`` ports (``None``)."""
    if mode is False:
        return []
    if mode is True and span == 0:
        span = ANY_SPAN
    return [f"--resv-ports={ntasks}"] if 0 < ntasks <= span else []


def cluster_span(runner: Runner) -> int:
    """:func:`mpi_ports_span` of this cluster (0 when ``scontrol`` cannot say)."""
    try:
        return mpi_ports_span(runner(["scontrol", "show", "config"], timeout=30))
    except (SlurmCommandError, OSError):
        return 0
