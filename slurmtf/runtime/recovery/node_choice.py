"""Which nodes a job's next step trains on, and which are left out for good.

:class:`Nodes` holds the allocation's nodes (Slurm's order), those left out already, the
fewest a step may train on (``MIN_NODES``, or a ``--nodes=MIN-MAX`` range's minimum),
how many it trains on (N of N+``SPARE_NODES``), the nodes found dead after an attempt,
the own crashes per node and the nodes Slurm reports drained. From them follow the nodes to
leave out next (:meth:`Nodes.next_excluded`: dead, struck twice, drained), the next
step's nodes (:meth:`Nodes.step_nodes`: a spare in a lost node's place, else the nodes
left) and those nodes in words. :func:`job_nodes` checks ``SPARE_NODES`` and
``MIN_NODES`` over the allocation. Whether a step runs again on them, or the job is
requeued without them, is :func:`slurmtf.runtime.recovery.decision.decide`'s to say.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from slurmtf.errors import InputError

STRIKES = 2  # ranks on one node crashed this often in a job's life: the node is left out


@dataclasses.dataclass(frozen=True)
class Nodes:
    """The allocation's nodes (Slurm's order), those left out already, the fewest a step
    may train on, those found dead after this attempt (probed by the edge), how many a
    step trains on (``width``: N of the N+``SPARE_NODES`` allocated; 0: every usable one)
    how often ranks crashed on each node in the job's life (``crashes``) and the nodes
    Slurm reports drained or down (``drained``: an administrator or a health check took
    them out of service while the job held them)."""

    allocated: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    minimum: int = 0
    dead: tuple[str, ...] = ()
    width: int = 0
    crashes: tuple[tuple[str, int], ...] = ()
    drained: tuple[str, ...] = ()

    def next_excluded(self) -> tuple[str, ...]:
        """Left out before, found dead now, then nodes whose ranks crashed
        :data:`STRIKES` times and drained nodes: none of them is used again. When too few
        nodes are left for the job (fewer than ``minimum``: no spare, no range, or a
        range whose minimum Slurm does not tell and ``MIN_NODES`` does not name), the
        decision is a requeue without them rather than a restart in place on them.
        Each once, in the order first seen."""
        struck = [n for n, count in self.crashes if count >= STRIKES]
        drained = [n for n in self.drained if n in self.allocated]
        return tuple(dict.fromkeys([*self.excluded, *self.dead, *struck, *drained]))

    def usable(self) -> tuple[str, ...]:
        left_out = set(self.next_excluded())
        return tuple(n for n in self.allocated if n not in left_out)

    def step_nodes(self) -> tuple[str, ...]:
        """The next step's nodes: ``width`` of the usable ones in Slurm's order (a spare
        takes a lost node's place), or every usable one when fewer are left (a range)."""
        usable = self.usable()
        return usable[: self.width] if self.width else usable

    def first_step(self) -> tuple[str, ...]:
        """The nodes the first step trains on: the first ``width`` (the others are spares)."""
        return self.allocated[: self.width] if self.width else self.allocated

    def placement(self) -> str:
        """The next step's nodes in words, once some were left out: ``training on a spare
        (node4)`` or ``training on the 2 node(s) left``."""
        nodes = self.step_nodes()
        spares = [n for n in nodes if n not in self.first_step()]
        if spares:
            return f"training on a spare ({','.join(spares)})"
        if len(nodes) < len(self.first_step()):
            return f"training on the {len(nodes)} node(s) left (minimum {self.minimum})"
        return f"training on {','.join(nodes)}"


def job_nodes(allocated: Sequence[str], spare_nodes: str = "", min_nodes: str = "") -> Nodes:
    """The job script's ``SPARE_NODES`` and ``MIN_NODES`` (as typed; "" when unset) over
    the allocation: train on the first N of N+``SPARE_NODES`` nodes; after a node loss go
    on with no fewer than ``MIN_NODES`` (default: N). An :class:`InputError` names the
    variable, its value and the fix."""
    total = len(allocated)
    spares = _count("SPARE_NODES", spare_nodes or "0", "e.g. SPARE_NODES=1")
    if total and spares >= total:
        raise InputError(
            "SPARE_NODES", spares, f"leaves none of the job's {total} node(s) to train on",
            f"ask for the training nodes plus the spares (sbatch -N{spares + 2} with "
            f"SPARE_NODES={spares} trains on 2 nodes)",
        )  # fmt: skip
    width = total - spares
    least = _count("MIN_NODES", min_nodes, "e.g. MIN_NODES=2") if min_nodes else width
    if total and not 1 <= least <= width:
        raise InputError(
            "MIN_NODES", least, f"must be 1..{width} (the nodes the job trains on)",
            f"MIN_NODES={min(2, width)} with sbatch --nodes={min(2, width)}-{width}, or unset it",
        )  # fmt: skip
    return Nodes(tuple(allocated), minimum=least, width=width if spares else 0)


def _count(name: str, text: str, hint: str) -> int:
    if not text.strip().isdigit():
        raise InputError(name, text, "is not a node count", hint)
    return int(text)
