"""Task roles (chief, ps, worker, evaluator): ``SLURMTF_JOBS`` / ``jobs=`` to one role per rank.

Pure. The syntax is TensorFlow's ``SlurmClusterResolver(jobs=...)`` written as text:
``ROLE[:COUNT][@COMPONENT]`` entries separated by commas, e.g. ``chief:1,ps:2,worker:2``.
Roles are handed out over the ranks in the order of the entries; the last entry may leave
its count out to take the remaining tasks (``chief:1,ps:2,worker``). In a heterogeneous
step every entry may name a component instead (``ps@0,worker@1``,
``chief:1@0,ps@0,worker@1``): then each component's ranks are handed out in the order
of its own entries, and the last entry of a component may take the rest of it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurmtf.errors import InputError

ROLES = ("chief", "ps", "worker", "evaluator")
DEFAULT_ROLE = "worker"
# TensorFlow allows one task of these roles in a cluster.
SINGLE_ROLES = ("chief", "evaluator")
_ENTRY = re.compile(r"(?P<role>[A-Za-z_]+)(?::(?P<count>\d{1,9}))?(?:@(?P<component>\d{1,4}))?")
_SYNTAX_HINT = (
    "write ROLE[:COUNT][@COMPONENT] entries separated by commas, e.g. chief:1,ps:2,worker "
    "(the last role without a count takes the remaining tasks)"
)


@dataclass(frozen=True)
class JobEntry:
    """One ``ROLE[:COUNT][@COMPONENT]``; ``count`` ``None``: the remaining tasks."""

    role: str
    count: int | None = None
    component: int | None = None


@dataclass(frozen=True)
class JobsSpec:
    """A parsed ``SLURMTF_JOBS`` (or ``jobs=``), with the name and text for messages."""

    entries: tuple[JobEntry, ...]
    name: str = "SLURMTF_JOBS"
    text: str = ""

    @property
    def by_component(self) -> bool:
        return self.entries[0].component is not None

    def error(self, problem: str, hint: str) -> InputError:
        return InputError(self.name, self.text, problem, hint)


def parse_jobs(value: str | Mapping[str, int | None], name: str = "SLURMTF_JOBS") -> JobsSpec:
    """Parse ``"chief:1,ps:2,worker"`` or ``{"chief": 1, "ps": 2, "worker": None}``.

    Checks what needs no knowledge of the step: syntax, known roles, counts of at least
    1, one task for ``chief``/``evaluator``, a count-less entry only last (per component),
    a role once (per component), and components named by all entries or by none.
    """
    text = value if isinstance(value, str) else _mapping_text(value, name)
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or not all(items):
        raise InputError(name, text, "has an empty entry", _SYNTAX_HINT)
    entries = tuple(_entry(item, name, text) for item in items)
    spec = JobsSpec(entries, name, text)
    if len({entry.component is None for entry in entries}) > 1:
        raise spec.error(
            "names components in some entries only",
            "give every entry a component (ps@0,worker@1) or none (ps:2,worker)",
        )
    seen: set[tuple[str, int | None]] = set()
    open_ended: set[int | None] = set()
    for entry in entries:
        where = "" if entry.component is None else f" in component {entry.component}"
        if (entry.role, entry.component) in seen:
            raise spec.error(f"names {entry.role!r} twice{where}", "name each role once")
        if entry.component in open_ended:
            raise spec.error(
                f"has an entry after the one without a count{where}",
                "leave the count out of the last entry only",
            )
        seen.add((entry.role, entry.component))
        if entry.count is None:
            open_ended.add(entry.component)
    if any(e.role == "ps" for e in entries) and not any(e.role == "chief" for e in entries):
        raise spec.error(
            "has ps tasks but no chief to run the training script (the coordinator)",
            "add chief:1 first, e.g. chief:1,ps:2,worker",
        )
    return spec


def assign_roles(
    spec: JobsSpec,
    ntasks: int,
    components: Sequence[int] | None = None,
    ncomponents: int = 0,
) -> tuple[str, ...]:
    """The role of every rank: ``spec``'s entries over ``ntasks`` ranks in order.

    ``components[r]`` is rank ``r``'s component in a heterogeneous step (``None``
    otherwise), ``ncomponents`` the job's component count (``SLURM_HET_SIZE``).
    """
    if not spec.by_component:
        return _hand_out(spec, spec.entries, ntasks, "the step")
    if components is None:
        raise spec.error(
            "names components but this step is not part of a heterogeneous job (no SLURM_HET_SIZE)",
            "leave out the @COMPONENT parts, or run srun --het-group=... in a het job",
        )
    named = {entry.component for entry in spec.entries}
    for component in sorted(c for c in named if c is not None and c >= ncomponents):
        raise spec.error(
            f"names component {component} but the job has {ncomponents} (SLURM_HET_SIZE)",
            f"use components 0..{ncomponents - 1}",
        )
    per_component: dict[int, list[str]] = {}
    for component in sorted(set(components)):
        size = list(components).count(component)
        entries = [entry for entry in spec.entries if entry.component == component]
        if not entries:
            raise spec.error(
                f"gives no role to the {size} task(s) of component {component} in this step",
                f"add an entry for it, e.g. worker@{component}",
            )
        per_component[component] = list(
            _hand_out(spec, entries, size, f"component {component} of the step")
        )
    return tuple(per_component[component].pop(0) for component in components)


def _hand_out(
    spec: JobsSpec, entries: Sequence[JobEntry], ntasks: int, where: str
) -> tuple[str, ...]:
    fixed = sum(entry.count or 0 for entry in entries)
    rest = ntasks - fixed
    open_ended = entries[-1].count is None
    if rest < 0 or (rest < 1 and open_ended):
        needs = f"at least {fixed + 1}" if open_ended else str(fixed)
        raise spec.error(
            f"asks for {needs} task(s) but {where} has {ntasks}",
            "ask for fewer tasks, or run the step with more (srun -n / --ntasks-per-node)",
        )
    if rest and not open_ended:
        raise spec.error(
            f"asks for {fixed} task(s) but {where} has {ntasks}",
            f"leave the last count out to give it the rest ({entries[-1].role}), or "
            "make the counts add up",
        )
    roles: list[str] = []
    for entry in entries:
        roles.extend([entry.role] * (rest if entry.count is None else entry.count))
    for role in SINGLE_ROLES:
        if roles.count(role) > 1:
            raise spec.error(
                f"gives {role!r} {roles.count(role)} tasks",
                f"TensorFlow allows one {role}: write {role}:1",
            )
    return tuple(roles)


def _entry(item: str, name: str, text: str) -> JobEntry:
    match = _ENTRY.fullmatch(item)
    if match is None:
        raise InputError(name, text, f"has the entry {item!r}", _SYNTAX_HINT)
    role = match["role"]
    if role not in ROLES:
        raise InputError(name, text, f"names the unknown role {role!r}", f"use {', '.join(ROLES)}")
    count = None if match["count"] is None else int(match["count"])
    if count == 0:
        raise InputError(
            name,
            text,
            f"gives {role!r} a count of 0",
            "leave the role out, or give it 1 task or more",
        )
    component = None if match["component"] is None else int(match["component"])
    return JobEntry(role, count, component)


def _mapping_text(jobs: Mapping[str, int | None], name: str) -> str:
    """``{"chief": 1, "worker": None}`` as ``"chief:1,worker"`` (keys may end in ``@N``)."""
    parts = []
    for role, count in jobs.items():
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
            raise InputError(name, dict(jobs), f"gives {role!r} the count {count!r}", _SYNTAX_HINT)
        head, at, component = str(role).partition("@")
        parts.append(head + ("" if count is None else f":{count}") + at + component)
    return ",".join(parts)


def task_ids(roles: Sequence[str]) -> tuple[int, ...]:
    """Every rank's index among the ranks of its role (TensorFlow's ``task.index``)."""
    seen: dict[str, int] = {}
    ids = []
    for role in roles:
        ids.append(seen.get(role, 0))
        seen[role] = ids[-1] + 1
    return tuple(ids)


def uses_gpus(role: str, roles: Sequence[str]) -> bool:
    """Whether a rank of ``role`` computes on GPUs: not a ps, nor the chief of a ps job
    (ParameterServerStrategy's coordinator only dispatches functions)."""
    if role == "ps":
        return False
    return not (role == "chief" and "ps" in roles)
