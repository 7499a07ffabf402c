"""The values of a job request, parsed and checked: times, signals, sweeps, extra sbatch
options, setup lines and any text that reaches the sbatch script.

Each function returns the clean value or raises :class:`InputError` naming the flag.
Pure, except ``bash -n`` (parse only) in :func:`check_setup_with_bash` (:mod:`slurmtf.spec.shell`).
"""

from __future__ import annotations

import itertools
import math
import random
import re
import shlex
from collections.abc import Sequence

from slurmtf.errors import InputError
from slurmtf.spec.shell import syntax_problem

# sbatch options slurmtf sets itself: set them through their own flag instead.
_MANAGED = {
    "nodes": "--nodes",
    "ntasks-per-node": "--gpus_per_node (tasks per node = GPUs per node)",
    "ntasks": "--nodes and --gpus_per_node",
    "output": "--log_dir",
    "error": "--log_dir",
    "array": "--sweep",
    "signal": "--signal and --signal_delay_s",
    "job-name": "--job_name",
    "gres": "--gpus_per_node",
    "gpus-per-node": "--gpus_per_node --gpu_flag=gpus-per-node",
    "gpus-per-task": "--gpus_per_node --gpu_flag=gpus-per-task",
    "time": "--time",
    "partition": "--partition",
    "account": "--account",
    "qos": "--qos",
    "constraint": "--constraint",
    "exclusive": "--exclusive",
    "mem": "--mem",
    "cpus-per-task": "--cpus_per_task",
    "cpus-per-gpu": "--cpus_per_gpu",
    "open-mode": "nothing (slurmtf appends to the logs across requeues)",
    "requeue": "--max_restarts (0 turns restarts and requeues off)",
    "no-requeue": "--max_restarts=0",
}
_SBATCH_KEY = re.compile(r"^[a-z][a-z0-9-]*$")
_SWEEP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TIME_FORMS = (
    re.compile(r"^(?P<m>\d+)$"),
    re.compile(r"^(?P<m>\d+):(?P<s>\d+)$"),
    re.compile(r"^(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d+)$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d+):(?P<m>\d+)$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)$"),
)


def check_text(name: str, value: str, *, allow_empty: bool = False) -> str:
    """Refuse control characters (newlines above all) and, unless allowed, empty text."""
    if not value and not allow_empty:
        raise InputError(name, value, "is empty", f"give {name} a value or leave the flag out")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise InputError(
            name, value, "contains a newline or control character", "use one line of printable text"
        )
    return value


def check_sbatch_value(name: str, value: str, *, allow_empty: bool = False) -> str:
    """A value for an ``#SBATCH`` line: one line, and no backslash.

    sbatch reads ``#SBATCH`` lines with its own parser, which treats a backslash as an
    escape even inside single quotes, so ``'a\\'`` is refused as unmatched quoting.
    """
    check_text(name, value, allow_empty=allow_empty)
    if "\\" in value:
        raise InputError(
            name, value, "contains a backslash, which sbatch's #SBATCH parser mangles", "drop it"
        )
    return value


def parse_time(value: str) -> int:
    """Slurm time (``30``, ``1:30:00``, ``2-12``...) -> whole minutes, at least 1."""
    text = value.strip()
    for form in _TIME_FORMS:
        match = form.match(text)
        if match:
            parts = {k: int(v) for k, v in match.groupdict().items() if v is not None}
            seconds = (
                parts.get("d", 0) * 86400
                + parts.get("h", 0) * 3600
                + parts.get("m", 0) * 60
                + parts.get("s", 0)
            )
            if seconds <= 0:
                break
            return max(1, -(-seconds // 60))
    raise InputError(
        "--time", value, "is not a positive Slurm time", "minutes (30), HH:MM:SS or D-HH:MM"
    )


# Random-search ranges: NAME=KIND:LOW:HIGH (one value); see :func:`sample_points`.
RANGE_KINDS = ("log", "uniform", "int")
MAX_SAMPLES = 10000


def parse_range(name: str, value: str) -> tuple[str, float, float] | None:
    """``log:1e-4:1e-1`` / ``uniform:0:0.5`` / ``int:16:128`` -> ``(kind, low, high)``;
    ``None`` for a grid value (no known ``KIND:`` prefix)."""
    kind, sep, rest = value.partition(":")
    if not sep or kind not in RANGE_KINDS:
        return None
    item = f"{name}={value}"
    low_text, sep, high_text = rest.partition(":")
    try:
        low, high = float(low_text), float(high_text)
    except ValueError:
        low = high = math.nan
    if not sep or not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        raise InputError(
            "--sweep", item, f"is not {kind}:LOW:HIGH with LOW < HIGH", f"e.g. {name}={kind}:1:10"
        )
    if kind == "log" and low <= 0:
        raise InputError("--sweep", item, "has a log range from 0 or below", "e.g. log:1e-4:1e-1")
    if kind == "int" and not (low.is_integer() and high.is_integer()):
        raise InputError("--sweep", item, "has an int range of non-integers", "e.g. int:16:128")
    return kind, low, high


def parse_sweep(items: Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``["lr=0.1,0.01", "batch_size=32,64"]`` -> ``(("lr", ("0.1", "0.01")), ...)``; a
    range (``lr=log:1e-4:1e-1``, for ``--samples``) is kept as its one value."""
    out: list[tuple[str, tuple[str, ...]]] = []
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip().removeprefix("--")
        if not sep or not _SWEEP_NAME.match(name):
            raise InputError(
                "--sweep",
                item,
                "is not NAME=V1,V2,... or NAME=KIND:LOW:HIGH",
                "e.g. --sweep=learning_rate=0.1,0.01 or --sweep=learning_rate=log:1e-4:1e-1",
            )
        vals = tuple(v.strip() for v in values.split(","))
        if len(vals) == 1 and parse_range(name, vals[0]) is not None:
            vals = (vals[0],)
        elif not all(vals):
            raise InputError(
                "--sweep", item, "has an empty value", "separate values by single commas"
            )
        for v in vals:
            check_text("--sweep", v)
        if len(set(vals)) != len(vals):
            raise InputError("--sweep", item, "repeats a value", "list each value once")
        if name in dict(out):
            raise InputError("--sweep", item, f"sweeps {name} twice", "give each name one --sweep")
        out.append((name, vals))
    return tuple(out)


def sweep_grid(sweep: Sequence[tuple[str, Sequence[str]]]) -> list[dict[str, str]]:
    """The grid, first name slowest (like nested loops in flag order); ``[{}]`` without sweep."""
    names = [name for name, _ in sweep]
    return [
        dict(zip(names, combo, strict=True)) for combo in itertools.product(*(v for _, v in sweep))
    ]


def _draw(rng: random.Random, name: str, values: Sequence[str]) -> str:
    """One value: a range sampled (log-uniform, uniform, integer), a list chosen from.
    Only ``rng.random()`` is used, so the points are the same on every Python."""
    found = parse_range(name, values[0]) if len(values) == 1 else None
    u = rng.random()
    if found is None:
        return values[min(int(u * len(values)), len(values) - 1)]
    kind, low, high = found
    if kind == "int":
        return str(min(int(low + u * (high - low + 1)), int(high)))
    if kind == "log":
        return f"{math.exp(math.log(low) + u * (math.log(high) - math.log(low))):.4g}"
    return f"{low + u * (high - low):.4g}"


def sample_points(
    sweep: Sequence[tuple[str, Sequence[str]]], samples: int, seed: int
) -> list[dict[str, str]]:
    """The points of a sweep: the grid without ``samples``, else ``samples`` random points
    drawn from ``seed`` (each name independently, in flag order): the same seed gives the
    same points. A range without ``--samples`` is an error."""
    if not samples:
        for name, values in sweep:
            if len(values) == 1 and parse_range(name, values[0]) is not None:
                raise InputError(
                    "--sweep",
                    f"{name}={values[0]}",
                    "is a range, which a grid cannot list",
                    "add --samples=N (random search), or list values: NAME=V1,V2",
                )
        return sweep_grid(sweep)
    if not 1 <= samples <= MAX_SAMPLES:
        raise InputError("--samples", samples, f"must be 1..{MAX_SAMPLES}", "e.g. --samples=16")
    if not sweep:
        raise InputError(
            "--samples", samples, "needs a --sweep to sample", "add --sweep=NAME=log:1e-4:1e-1"
        )
    rng = random.Random(seed)
    return [{name: _draw(rng, name, values) for name, values in sweep} for _ in range(samples)]


def parse_extra(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``["mail-type=END", "requeue"]`` -> validated ``(key, value)``; ``""`` is a bare flag."""
    out: list[tuple[str, str]] = []
    for item in items:
        key, _, value = item.partition("=")
        key = key.strip().removeprefix("--").replace("_", "-")
        if not _SBATCH_KEY.match(key):
            raise InputError(
                "--sbatch_extra",
                item,
                "is not KEY=VALUE with an sbatch option name",
                "e.g. mail-type=END",
            )
        if key in _MANAGED:
            raise InputError(
                "--sbatch_extra",
                item,
                f"sets --{key}, which slurmtf manages",
                f"use {_MANAGED[key]}",
            )
        check_sbatch_value("--sbatch_extra", value, allow_empty=True)
        out.append((key, value))
    return tuple(out)


def check_setup_lines(lines: Sequence[str]) -> tuple[str, ...]:
    """Each ``--setup`` is one line: balanced quotes, no ``#SBATCH``, no line continuation."""
    for line in lines:
        check_text("--setup", line)
        if line.lstrip().upper().startswith("#SBATCH"):
            raise InputError(
                "--setup", line, "would be read as an sbatch option", "use --sbatch_extra"
            )
        if line.rstrip().endswith("\\"):
            raise InputError(
                "--setup", line, "ends with a line continuation", "give one complete line"
            )
        try:
            shlex.split(line, comments=True)
        except ValueError as exc:
            raise InputError(
                "--setup", line, f"is not a complete shell line ({exc})", "balance the quotes"
            ) from exc
    return tuple(lines)


def check_setup_with_bash(lines: Sequence[str]) -> tuple[str, ...]:
    """:func:`check_setup_lines`, then bash's own parse: each line one complete command.

    Runs ``bash -n`` (parse only), once, where the flags are read (``slurmtf submit``).
    """
    check_setup_lines(lines)
    for line in lines:
        problem = syntax_problem(line)
        if problem:
            raise InputError(
                "--setup",
                line,
                f"is not one complete shell command ({problem})",
                "close every block, quote and here-document on the same line, or use several "
                "--setup lines that each stand alone",
            )
    return tuple(lines)
