"""The job a user asks for, as one frozen value, and its pure rendering.

:class:`JobSpec` is validated when built: every value that reaches the sbatch script is
checked here (no control characters, known GPU flag, sane counts), then quoted by
submitit's own renderer, so hostile names, paths and setup lines cannot inject.
Everything in this module is a function of values: no environment, and no subprocess
except ``bash -n`` (parse only) on ``--setup`` lines, see :mod:`slurmtf.shell`.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import shlex
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slurmtf.errors import InputError
from slurmtf.shell import syntax_problem

MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mnist": ("models.mnist", ()),
    "resnet20": ("models.resnet", ("--resnet_size=20",)),
    "resnet56": ("models.resnet", ("--resnet_size=56",)),
    "resnet50": ("models.resnet", ("--resnet_size=50",)),
}
KINDS = ("model", "module", "function", "command")
GPU_FLAGS = ("gres", "gpus-per-node", "gpus-per-task")
CLUSTERS = ("slurm", "local")
EXIT_PREEMPTED = 75
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
    "open-mode": "nothing (slurmtf appends to the logs across requeues)",
    "requeue": "--max_requeues (0 turns requeueing off)",
    "no-requeue": "--max_requeues=0",
}
_SBATCH_KEY = re.compile(r"^[a-z][a-z0-9-]*$")
_SWEEP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MEM = re.compile(r"^[0-9]+[KMGT]?B?$", re.IGNORECASE)
_TIME_FORMS = (
    re.compile(r"^(?P<m>\d+)$"),
    re.compile(r"^(?P<m>\d+):(?P<s>\d+)$"),
    re.compile(r"^(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d+)$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d+):(?P<m>\d+)$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)$"),
)
_REFUSED_SIGNALS = {
    "USR1": "NCCL reserves SIGUSR1; use USR2 (the default)",
    "KILL": "SIGKILL cannot be caught; use USR2",
    "STOP": "SIGSTOP cannot be caught; use USR2",
}


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


def parse_signal(value: str) -> str:
    """``USR2``/``SIGUSR2``/``12`` -> ``USR2``; refuses USR1 (NCCL), KILL and STOP."""
    text = value.strip().upper()
    try:
        sig = (
            signal.Signals(int(text))
            if text.isdigit()
            else signal.Signals["SIG" + text.removeprefix("SIG")]
        )
    except (KeyError, ValueError) as exc:
        raise InputError("--signal", value, "is not a signal", "e.g. USR2 (default), TERM") from exc
    name = sig.name.removeprefix("SIG")
    if name in _REFUSED_SIGNALS:
        raise InputError(
            "--signal", value, "cannot be the preemption signal", _REFUSED_SIGNALS[name]
        )
    return name


def parse_sweep(items: Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``["lr=0.1,0.01", "batch_size=32,64"]`` -> ``(("lr", ("0.1", "0.01")), ...)``."""
    out: list[tuple[str, tuple[str, ...]]] = []
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip().removeprefix("--")
        if not sep or not _SWEEP_NAME.match(name):
            raise InputError(
                "--sweep", item, "is not NAME=V1,V2,...", "e.g. --sweep=learning_rate=0.1,0.01"
            )
        vals = tuple(v.strip() for v in values.split(","))
        if not all(vals):
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


def check_setup(lines: Sequence[str]) -> tuple[str, ...]:
    """Each ``--setup`` is one complete shell line (quotes balanced, no ``#SBATCH``)."""
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


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """One job (or one job array): what runs, where, and for how long. Validated when built."""

    kind: str
    target: str
    args: tuple[str, ...] = ()
    nodes: int = 1
    gpus_per_node: int = 0
    gpu_flag: str = "gres"
    cpus_per_task: int | None = None
    mem: str | None = None
    time_min: int = 60
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    setup: tuple[str, ...] = ()
    sbatch_extra: tuple[tuple[str, str], ...] = ()
    job_name: str = "slurmtf"
    log_dir: str = "slurmtf_logs"
    signal: str = "USR2"
    signal_delay_s: int = 120
    max_requeues: int = 3
    sweep: tuple[tuple[str, tuple[str, ...]], ...] = ()
    array_parallelism: int = 256
    cluster: str = "slurm"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError("kind", self.kind, "is unknown", f"one of {', '.join(KINDS)}")
        if self.kind == "model" and self.target not in MODELS:
            raise InputError(
                "--model", self.target, "is not a bundled model", f"one of {', '.join(MODELS)}"
            )
        if self.kind == "function" and not re.match(r"^[\w.]+:[\w.]+$", self.target):
            raise InputError(
                "--function", self.target, "is not MODULE:FUNCTION", "e.g. mypkg.train:main"
            )
        if self.kind == "module" and not re.match(
            r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*$", self.target
        ):
            raise InputError(
                "--module", self.target, "is not a dotted module name", "e.g. mypkg.train"
            )
        if self.kind == "command":
            check_text("--command", self.target)
            try:
                if not shlex.split(self.target):
                    raise ValueError("no words")
            except ValueError as exc:
                raise InputError(
                    "--command", self.target, f"cannot be split ({exc})", "quote it as in a shell"
                ) from exc
        for name, low, value in (
            ("--nodes", 1, self.nodes),
            ("--gpus_per_node", 0, self.gpus_per_node),
            ("--time", 1, self.time_min),
            ("--signal_delay_s", 0, self.signal_delay_s),
            ("--max_requeues", 0, self.max_requeues),
            ("--array_parallelism", 1, self.array_parallelism),
        ):
            if value < low:
                raise InputError(
                    name, value, f"must be at least {low}", f"pass {name}={low} or more"
                )
        if self.cpus_per_task is not None and self.cpus_per_task < 1:
            raise InputError(
                "--cpus_per_task",
                self.cpus_per_task,
                "must be at least 1",
                "leave it out or pass 1+",
            )
        if self.gpu_flag not in GPU_FLAGS:
            raise InputError(
                "--gpu_flag", self.gpu_flag, "is unknown", f"one of {', '.join(GPU_FLAGS)}"
            )
        if self.cluster not in CLUSTERS:
            raise InputError(
                "--cluster", self.cluster, "is unknown", f"one of {', '.join(CLUSTERS)}"
            )
        if self.mem is not None and not _MEM.match(self.mem):
            raise InputError("--mem", self.mem, "is not a Slurm memory size", "e.g. 16G or 4000M")
        for name, text in (
            ("--partition", self.partition),
            ("--account", self.account),
            ("--qos", self.qos),
            ("--constraint", self.constraint),
        ):
            if text is not None:
                check_sbatch_value(name, text)
        check_sbatch_value("--job_name", self.job_name)
        check_sbatch_value("--log_dir", self.log_dir)
        if "%" in self.log_dir:
            raise InputError(
                "--log_dir", self.log_dir, "contains %", "slurmtf adds job and task ids itself"
            )
        check_setup(self.setup)
        parse_extra([f"{k}={v}" if v else k for k, v in self.sbatch_extra])
        parse_signal(self.signal)
        for arg in self.args:
            check_text("model/command argument", arg, allow_empty=True)

    @property
    def tasks_per_node(self) -> int:
        """One task per GPU; one task per node without GPUs."""
        return max(1, self.gpus_per_node)

    @property
    def num_tasks(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def grid(self) -> list[dict[str, str]]:
        return sweep_grid(self.sweep)

    @property
    def folder(self) -> Path:
        """Absolute log folder (submitit writes ``%j_%t_log.out``/``.err`` there)."""
        return Path(self.log_dir).expanduser().absolute()

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSpec:
        fields = dict(data)
        for key in ("args", "setup"):
            fields[key] = tuple(fields.get(key, ()))
        fields["sbatch_extra"] = tuple(tuple(p) for p in fields.get("sbatch_extra", ()))
        fields["sweep"] = tuple((n, tuple(v)) for n, v in fields.get("sweep", ()))
        return cls(**fields)


def sbatch_parameters(spec: JobSpec) -> dict[str, Any]:
    """The parameters of submitit's ``SlurmExecutor.update_parameters`` for ``spec``."""
    params: dict[str, Any] = {
        "job_name": spec.job_name,
        "time": spec.time_min,
        "nodes": spec.nodes,
        "ntasks_per_node": spec.tasks_per_node,
        "signal_delay_s": spec.signal_delay_s,
        "array_parallelism": spec.array_parallelism,
        # A failed rank stops the others instead of idling until the time limit.
        "srun_args": ["--kill-on-bad-exit=1"],
    }
    if spec.gpus_per_node:
        if spec.gpu_flag == "gres":
            params["gres"] = f"gpu:{spec.gpus_per_node}"
        elif spec.gpu_flag == "gpus-per-node":
            params["gpus_per_node"] = spec.gpus_per_node
        else:
            params["gpus_per_task"] = 1
    for key in ("cpus_per_task", "mem", "partition", "account", "qos", "constraint"):
        value = getattr(spec, key)
        if value is not None:
            params[key] = value
    if spec.exclusive:
        params["exclusive"] = True
    if spec.setup:
        params["setup"] = list(spec.setup)
    extra: dict[str, Any] = {"signal": f"{spec.signal}@{spec.signal_delay_s}"}
    # Requeueable, so that `scontrol requeue` (after exit 75) and node failures restart it.
    extra["requeue" if spec.max_requeues else "no-requeue"] = True
    extra.update({k: (v if v else True) for k, v in spec.sbatch_extra})
    params["additional_parameters"] = extra
    return params


def _has_flag(args: Sequence[str], name: str) -> bool:
    return any(a == f"--{name}" or a.startswith(f"--{name}=") for a in args)


def task_command(
    spec: JobSpec, params: Mapping[str, str], python: str = "python3", job_id: str = "%j"
) -> list[str]:
    """The command each task runs (``TF_CONFIG`` is added to its environment at run time).

    A bundled model gets ``--preemption_signal`` and, unless given, a ``--model_dir``
    under the log folder named after the job, so that a requeued job resumes there.
    """
    sweep_args = [f"--{k}={v}" for k, v in params.items()]
    if spec.kind == "model":
        module, fixed = MODELS[spec.target]
        given = [*spec.args, *sweep_args]
        added = (
            [] if _has_flag(given, "preemption_signal") else [f"--preemption_signal={spec.signal}"]
        )
        if not _has_flag(given, "model_dir"):
            added.append(f"--model_dir={spec.folder / f'{job_id}_model'}")
        return [python, "-u", "-m", module, *fixed, *added, *given]
    if spec.kind == "module":
        return [python, "-u", "-m", spec.target, *spec.args, *sweep_args]
    if spec.kind == "command":
        return [*shlex.split(spec.target), *spec.args, *sweep_args]
    return [
        python,
        "-u",
        "-m",
        "slurmtf.launch",
        "--call",
        spec.target,
        "--",
        *spec.args,
        *sweep_args,
    ]


def render_sbatch(spec: JobSpec, python: str, *, map_count: int | None = None) -> str:
    """The exact sbatch script submitit writes for ``spec`` (same renderer, same command).

    ``python`` is the interpreter's path; it is quoted here, as submitit quotes
    ``sys.executable``.
    """
    from submitit.slurm import slurm as submitit_slurm

    params = sbatch_parameters(spec)
    if map_count is not None and map_count > 1:
        params["map_count"] = map_count
    command = " ".join(
        [shlex.quote(python), "-u -m submitit.core._submit", shlex.quote(str(spec.folder))]
    )
    text: str = submitit_slurm._make_sbatch_string(command=command, folder=spec.folder, **params)
    return text
