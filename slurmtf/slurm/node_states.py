"""What Slurm's node states leave a job that is requeued without some nodes: pure
functions of sinfo's states (the edge that asks is :mod:`slurmtf.runtime.slurm_calls`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

# sinfo's long state names (%T) of a node out of service: drained, draining, down, fail,
# failing (a trailing * means not responding, ~ powered off, ...).
OUT_OF_SERVICE = ("drain", "down", "fail")


def out_of_service(states: Mapping[str, str]) -> tuple[str, ...]:
    """The nodes (name -> sinfo's ``%T``) Slurm will not start a job on."""
    return tuple(n for n, state in states.items() if state.startswith(OUT_OF_SERVICE))


@dataclasses.dataclass(frozen=True)
class Exclusion:
    """The nodes a requeue adds to ``ExcNodeList`` and, when it had to keep some, why."""

    exclude: tuple[str, ...]
    line: str = ""


def meetable_exclusion(
    exclude: Sequence[str], states: Mapping[str, str], needed: int, before: Sequence[str] = ()
) -> Exclusion:
    """The exclusions a requeue may add: all of ``exclude`` while the job's partition(s)
    (``states``: node -> sinfo's ``%T``) still hold ``needed`` nodes in service outside
    them and ``before`` (the job's ExcNodeList); else only those Slurm has taken out of
    service itself (leaving them out costs nothing), with the line that says so. All of
    them when sinfo did not tell."""
    if not exclude or not states or needed < 1:
        return Exclusion(tuple(exclude))
    down = set(out_of_service(states))
    avoid = {*exclude, *before, *down}
    usable = [n for n in states if n not in avoid]
    if len(usable) >= needed:
        return Exclusion(tuple(exclude))
    kept = tuple(n for n in exclude if n in down)
    spared = [n for n in exclude if n not in down]
    if not spared:
        return Exclusion(kept)
    line = (f"the restarted job does not avoid node(s) {','.join(spared)}: without them its "
            f"partition has {len(usable)} node(s) in service for the {needed} it asks, and it "
            "could never start")  # fmt: skip
    return Exclusion(kept, line)
