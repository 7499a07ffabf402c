"""Slurm hostlists (``rack[1-2]-n[01-04],login1``) and task counts (``2(x3),1``).

Pure functions. Ranges inside brackets are expanded by python-hostlist; this module
splits the expression the way Slurm does and keeps Slurm's order (never sorted, duplicates
kept). With several bracket groups in one name Slurm's ``scontrol show hostnames`` varies
the last group fastest, then the first, second, ... up to the one before the last
(``a[1-2]b[1-2]c[1-2]`` gives ``a1b1c1 a1b1c2 a2b1c1 a2b1c2 a1b2c1 ...``); so do we. Text
after the last bracket (``n[1-2]-ib``) is kept as a suffix, which newer Slurm releases
accept too.
"""

from __future__ import annotations

import itertools
import re

import hostlist

from slurmtf.errors import InputError

# Slurm refuses ranges of more than 65,536 hosts; a whole list is capped here.
MAX_HOSTS = 131_072
# Most tasks one `2(x3)` item may describe; far beyond any real step.
MAX_TASKS = 1_048_576

_NAME_TEXT = re.compile(r"[A-Za-z0-9._-]*")
_GROUP = re.compile(r"\[([^\[\]]*)\]")
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_COUNT = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")

_HOSTLIST_HINT = (
    "use Slurm's syntax, e.g. node[01-04,9],gpu-[1-2].ib.cluster; print it with "
    "`scontrol show hostnames` to compare"
)
_COUNTS_HINT = "use Slurm's syntax, a comma list of counts with optional repeats, e.g. 2(x3),1"


def expand_hostlist(text: str, *, name: str = "hostlist") -> list[str]:
    """Expand a Slurm hostlist into host names, in Slurm's order.

    ``name`` is the variable or flag the text came from; errors name it.
    """
    hosts: list[str] = []
    for part in _split_top_level(text, name):
        hosts.extend(_expand_part(part, text, name, MAX_HOSTS - len(hosts)))
    return hosts


def parse_task_counts(text: str, *, name: str = "tasks per node") -> list[int]:
    """Expand Slurm's task counts (``2(x3),1`` -> ``[2, 2, 2, 1]``)."""
    counts: list[int] = []
    stripped = text.strip()
    if not stripped:
        raise _error(name, text, "is empty", _COUNTS_HINT)
    for item in stripped.split(","):
        match = _COUNT.fullmatch(item.strip())
        if match is None:
            raise _error(name, text, f"{item!r} is not a count like 2 or 2(x3)", _COUNTS_HINT)
        count, repeat = int(match.group(1)), int(match.group(2) or 1)
        if repeat < 1:
            raise _error(name, text, f"{item!r} repeats a count zero times", _COUNTS_HINT)
        if count > MAX_TASKS or len(counts) + repeat > MAX_HOSTS:
            raise _error(name, text, "describes more tasks or nodes than allowed", _COUNTS_HINT)
        counts.extend([count] * repeat)
    return counts


def _split_top_level(text: str, name: str) -> list[str]:
    """Split at commas and blanks outside brackets; reject unbalanced or nested brackets."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise _error(name, text, "has nested brackets", _HOSTLIST_HINT)
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise _error(name, text, "has a ']' without its '['", _HOSTLIST_HINT)
        elif depth == 0 and (char == "," or char.isspace()):
            parts.append(text[start:i])
            start = i + 1
        elif depth == 1 and char.isspace():
            raise _error(name, text, "has a blank inside brackets", _HOSTLIST_HINT)
    if depth:
        raise _error(name, text, "has a '[' without its ']'", _HOSTLIST_HINT)
    parts.append(text[start:])
    return [part for part in parts if part]


def _expand_part(part: str, text: str, name: str, room: int) -> list[str]:
    """Expand one comma-free item, e.g. ``rack[1-2]-n[01-04]-ib``."""
    pieces = _GROUP.split(part)  # text, group, text, group, ..., text
    literals, groups = pieces[0::2], pieces[1::2]
    for literal in literals:
        if not _NAME_TEXT.fullmatch(literal):
            bad = next(c for c in literal if not _NAME_TEXT.fullmatch(c))
            raise _error(
                name,
                text,
                f"has {bad!r} in a host name",
                "host names use letters, digits, '-', '_' and '.'; " + _HOSTLIST_HINT,
            )
    if not groups:
        return [part]
    expanded = [_expand_group(group, text, name) for group in groups]
    total = 1
    for values in expanded:
        total *= len(values)
    if total > room:
        raise _error(name, text, f"expands to more than {MAX_HOSTS:,} hosts", _HOSTLIST_HINT)
    if len(groups) == 1:
        head, tail = literals
        return [f"{head}{value}{tail}" for value in expanded[0]]
    # Slurm's loop order, slowest first: groups k-1, k-2, ..., 1, then k (fastest).
    order = [*range(len(groups) - 2, -1, -1), len(groups) - 1]
    hosts = []
    chosen = [""] * len(groups)
    for combo in itertools.product(*(expanded[i] for i in order)):
        for slot, value in zip(order, combo, strict=True):
            chosen[slot] = value
        hosts.append("".join(lit + val for lit, val in zip(literals, [*chosen, ""], strict=True)))
    return hosts


def _expand_group(group: str, text: str, name: str) -> list[str]:
    """Expand the inside of one bracket pair (``01-04,9``) with python-hostlist."""
    if not group:
        raise _error(name, text, "has empty brackets []", _HOSTLIST_HINT)
    for item in group.split(","):
        match = _RANGE.fullmatch(item)
        if match is None:
            raise _error(
                name, text, f"has {item!r} in brackets, not a number or range", _HOSTLIST_HINT
            )
        low, high = match.group(1), match.group(2)
        if high is None:
            continue
        if int(high) < int(low):
            raise _error(
                name,
                text,
                f"has the reversed range {item!r}",
                f"write it low-high, e.g. [{high}-{low}]; Slurm rejects reversed ranges",
            )
        if int(high) - int(low) >= MAX_HOSTS:
            raise _error(name, text, f"has the range {item!r}, too many hosts", _HOSTLIST_HINT)
    try:
        values: list[str] = hostlist.expand_rangelist("", group)
    except hostlist.BadHostlist as exc:  # pragma: no cover - checked above
        raise _error(name, text, f"is not a valid hostlist ({exc})", _HOSTLIST_HINT) from exc
    return values


def _error(name: str, text: str, problem: str, hint: str) -> InputError:
    """An InputError quoting ``text``, shortened when too long for one line."""
    return InputError(name, short(text), problem, hint)


def short(text: str, limit: int = 160) -> str:
    """The text itself, or its start when it is too long to quote in one line."""
    return text if len(text) <= limit else text[:limit] + "..."
