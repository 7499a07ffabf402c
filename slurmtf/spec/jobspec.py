"""The job a user asks for, as one frozen value, and its pure rendering.

:class:`JobSpec` is validated when built: every value that reaches the sbatch script is
checked here (no control characters, known GPU flag, sane counts), then quoted by
submitit's own renderer, so hostile names, paths and setup lines cannot inject.
Everything in this module is a function of values: no environment, no subprocess (the
single values are checked by :mod:`slurmtf.spec.values`).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slurmtf.cluster import roles
from slurmtf.contracts import DEFAULT_LOG_DIR, parse_preemption_signal
from slurmtf.errors import InputError
from slurmtf.runtime.recovery.budget import DEFAULT_MODE, parse_mode
from slurmtf.spec.values import (
    check_sbatch_value,
    check_setup_lines,
    check_text,
    parse_extra,
    sample_points,
)

MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    # the bundled models as installed (models/ of the checkout, see pyproject.toml)
    "mnist": ("slurmtf_models.mnist", ()),
    "resnet20": ("slurmtf_models.resnet", ("--resnet_size=20",)),
    "resnet56": ("slurmtf_models.resnet", ("--resnet_size=56",)),
    "resnet50": ("slurmtf_models.resnet", ("--resnet_size=50",)),
}
KINDS = ("model", "module", "function", "command")
PS_KINDS = ("command", "module")  # what the chief of a --jobs job runs
SERVE = "slurmtf.serve"  # python -m slurmtf.serve: the tasks of a --jobs job
GPU_FLAGS = ("gres", "gpus-per-node", "gpus-per-task")
CLUSTERS = ("slurm", "local")
LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"
DEFAULT_SIGNAL_DELAY_S = 120  # Slurm's warning before the time limit, as the job scripts set it
RUN_LAUNCHER = "slurmtf.run"  # python -m slurmtf.run: unmodified scripts (module and command jobs)
_PYTHON = re.compile(r"python[0-9.]*")
_MEM = re.compile(r"^[0-9]+[KMGT]?B?$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """One job (or one job array): what runs, where, and for how long. Validated when built."""

    kind: str
    target: str
    args: tuple[str, ...] = ()
    nodes: int = 1
    max_nodes: int = 0  # a --nodes=MIN-MAX range: its maximum (0: exactly ``nodes``)
    gpus_per_node: int = 0
    gpu_flag: str = "gres"
    gpus_per_task: int = 1
    cpus_per_task: int | None = None
    cpus_per_gpu: int | None = None  # each GPU's CPUs (else the site's DefCpuPerGPU)
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
    log_dir: str = DEFAULT_LOG_DIR
    signal: str = "USR2"
    signal_delay_s: int | None = None  # None: warning_s's default
    max_requeues: int = 3
    restart_budget: str = DEFAULT_MODE  # what --max_restarts counts (RESTART_BUDGET)
    max_failures_per_hour: int = 0  # MAX_FAILURES_PER_HOUR (0: no limit)
    sweep: tuple[tuple[str, tuple[str, ...]], ...] = ()
    samples: int = 0  # random search: this many points drawn from sweep_seed (0: the grid)
    sweep_seed: int = 0
    array_parallelism: int = 256
    cluster: str = "slurm"
    legacy_keras: bool = False  # TF_USE_LEGACY_KERAS=1 in every task: tf.keras is tf_keras
    stage_data: bool = False  # copy --data_dir to each node's scratch first (the supervisor)
    check_first: bool = False  # `slurmtf check` first; an outlier node: requeue without it
    jobs: str | None = None  # roles (chief:1,ps:2,worker): a ParameterServerStrategy job
    cluster_flags: bool = False  # the script gets --worker_hosts, --task_index (slurmtf.run)
    spare_nodes: int = 0  # allocate nodes + spare_nodes, train on nodes (SPARE_NODES)
    no_kill: bool = True  # sbatch --no-kill: a failed node does not end the allocation
    container_prefix: str = ""  # every rank's command behind it ("apptainer exec --nv tf.sif")
    container_python: str = ""  # the ranks' interpreter behind it (default: python3, the image's)

    def __post_init__(self) -> None:
        self._check_target()
        self._check_numbers()
        self._check_choices()
        self._check_texts()
        sample_points(self.sweep, self.samples, self.sweep_seed)  # ranges need samples
        if self.jobs is not None:
            self._check_jobs()
        if self.stage_data:
            staged_source(self)
        if self.cluster_flags:
            self._check_cluster_flags()

    def _check_target(self) -> None:
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

    @property
    def warning_s(self) -> int:
        """Seconds before the time limit the preemption signal arrives: --signal_delay_s,
        else 120, or a quarter of a --time under 8 minutes (so that a short job is not
        warned as it starts)."""
        if self.signal_delay_s is not None:
            return self.signal_delay_s
        return min(DEFAULT_SIGNAL_DELAY_S, self.time_min * 60 // 4)

    def _check_numbers(self) -> None:
        for name, low, value in (
            ("--nodes", 1, self.nodes),
            ("--gpus_per_node", 0, self.gpus_per_node),
            ("--gpus_per_task", 1, self.gpus_per_task),
            ("--time", 1, self.time_min),
            ("--signal_delay_s", 0, self.warning_s),
            ("--max_restarts", 0, self.max_requeues),
            ("--max_failures_per_hour", 0, self.max_failures_per_hour),
            ("--array_parallelism", 1, self.array_parallelism),
            ("--spare_nodes", 0, self.spare_nodes),
        ):
            if value < low:
                raise InputError(
                    name, value, f"must be at least {low}", f"pass {name}={low} or more"
                )
        if self.warning_s >= self.time_min * 60:
            raise InputError(
                "--signal_delay_s",
                self.warning_s,
                f"is not shorter than --time={self.time_min} ({self.time_min * 60} s): "
                "the warning would come as the job starts",
                "pass a smaller --signal_delay_s or a longer --time",
            )
        if self.spare_nodes and (self.is_range or self.jobs is not None):
            raise InputError(
                "--spare_nodes",
                self.spare_nodes,
                "goes with a fixed node count of a data-parallel job",
                "drop --spare_nodes (a --nodes=MIN-MAX range goes on on the nodes left)",
            )
        if self.max_nodes and self.max_nodes < self.nodes:
            raise InputError(
                "--nodes",
                f"{self.nodes}-{self.max_nodes}",
                "has its maximum below its minimum",
                f"--nodes={self.max_nodes}-{self.nodes}",
            )
        if self.cpus_per_task is not None and self.cpus_per_task < 1:
            raise InputError(
                "--cpus_per_task",
                self.cpus_per_task,
                "must be at least 1",
                "leave it out or pass 1+",
            )
        self._check_cpus_per_gpu()
        if self.gpus_per_node % self.gpus_per_task:
            raise InputError(
                "--gpus_per_task",
                self.gpus_per_task,
                f"does not divide --gpus_per_node={self.gpus_per_node}",
                "use a divisor, e.g. --gpus_per_task=1 (one worker per GPU) or "
                "--gpus_per_task=GPUS_PER_NODE (one worker per node)",
            )

    def _check_cpus_per_gpu(self) -> None:
        """``--cpus_per_gpu``: 1 or more, on a job with GPUs, not beside ``--cpus_per_task``
        (sbatch refuses both; beside no GPU, Slurm 25.11 and 26.05 refuse the job and 22.05's
        steps fail "Invalid generic resource")."""
        value = self.cpus_per_gpu
        if value is None:
            return
        if value < 1:
            raise InputError(
                "--cpus_per_gpu", value, "must be at least 1", "leave it out or pass 1+"
            )
        if self.cpus_per_task is not None:
            raise InputError(
                "--cpus_per_gpu", value,
                f"goes with no --cpus_per_task (here {self.cpus_per_task}): sbatch refuses both",
                "keep one: --cpus_per_gpu for GPU jobs",
            )  # fmt: skip
        if not self.gpus_per_node:
            raise InputError(
                "--cpus_per_gpu", value, "needs GPUs (--gpus_per_node)",
                "give a CPU-only job --cpus_per_task=N",
            )  # fmt: skip

    def _check_choices(self) -> None:
        parse_mode(self.restart_budget, "--restart_budget")
        if self.gpu_flag not in GPU_FLAGS:
            raise InputError(
                "--gpu_flag", self.gpu_flag, "is unknown", f"one of {', '.join(GPU_FLAGS)}"
            )
        if self.is_range and self.gpu_flag == "gpus-per-task" and self.gpus_per_node:
            raise InputError(
                "--gpu_flag",
                self.gpu_flag,
                f"fixes the task count, so --nodes={self.node_count} would run on its minimum",
                "use --gpu_flag=gres or --gpu_flag=gpus-per-node with a --nodes range",
            )
        if self.cluster not in CLUSTERS:
            raise InputError(
                "--cluster", self.cluster, "is unknown", f"one of {', '.join(CLUSTERS)}"
            )

    def _check_texts(self) -> None:
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
        try:
            shlex.split(self.container_prefix)
        except ValueError as exc:
            raise InputError(
                "--container_prefix", self.container_prefix, f"is not a command line ({exc})",
                "e.g. --container_prefix='apptainer exec --nv tf.sif'",
            ) from exc  # fmt: skip
        if self.container_python and not self.container_prefix:
            raise InputError(
                "--container_python", self.container_python, "names the interpreter inside a "
                "container, and the job has no --container_prefix",
                "add --container_prefix='apptainer exec --nv IMAGE', or drop --container_python",
            )  # fmt: skip
        check_sbatch_value("--log_dir", self.log_dir)
        if "%" in self.log_dir:
            raise InputError(
                "--log_dir", self.log_dir, "contains %", "slurmtf adds job and task ids itself"
            )
        check_setup_lines(self.setup)  # bash -n: jobvalues.check_setup_with_bash, at submit
        parse_extra([f"{k}={v}" if v else k for k, v in self.sbatch_extra])
        parse_preemption_signal(self.signal, "--signal")
        for arg in self.args:
            check_text("model/command argument", arg, allow_empty=True)

    def _check_jobs(self) -> None:
        """``--jobs``: roles.py's syntax, a script to coordinate, tasks that add up."""
        spec = roles.parse_jobs(str(self.jobs), name="--jobs")
        if spec.by_component:
            raise spec.error(
                "names components, but slurmtf submit makes no heterogeneous job",
                "leave out the @COMPONENT parts, or use jobs/parameter_server.sbatch with "
                "#SBATCH hetjob (docs/BRING_YOUR_OWN.md)",
            )
        if self.cluster != "slurm":
            raise spec.error(
                "runs on Slurm only (--cluster=slurm)",
                "leave out --cluster=local: a parameter-server job needs a Slurm step "
                "(or start every task yourself: slurmtf serve -- python SCRIPT)",
            )
        if self.kind not in PS_KINDS:
            raise spec.error(
                f"needs the chief's own script, not --{self.kind}",
                "give --command='python train.py' or --module=mypkg.train that builds "
                "ParameterServerStrategy (e.g. examples/parameter_server.py)",
            )
        if self.is_range:
            raise spec.error(
                f"fixes the roles' tasks, so --nodes={self.node_count} would run on its minimum",
                f"pass a node count (--nodes={self.nodes}), or no --jobs",
            )
        if self.fixed_tasks is not None and self.fixed_tasks < self.nodes:
            raise spec.error(
                f"asks for {self.fixed_tasks} task(s), fewer than --nodes={self.nodes}",
                f"pass --nodes={self.fixed_tasks} or fewer, or more tasks",
            )
        roles.assign_roles(spec, self.num_tasks)  # the counts fit the job's tasks

    def _check_cluster_flags(self) -> None:
        """``--cluster_flags``: a script started through slurmtf.run, all of it workers."""
        hint = "give --command='python train.py' or --module=mypkg.train, or no --cluster_flags"
        if self.kind == "model":
            hint = "leave it out: a bundled model finds its place in the job itself"
        if self.jobs is not None:
            hint = "leave it out: a ps job's roles are in TF_CONFIG, not in --worker_hosts"
        command = self.kind == "command" and RUN_LAUNCHER in through_launcher(
            shlex.split(self.target)
        )
        if self.jobs is not None or not (command or self.kind == "module"):
            what = f"--jobs={self.jobs}" if self.jobs else f"--{self.kind}={self.target}"
            raise InputError(
                "--cluster_flags",
                True,
                f"appends --worker_hosts/--task_index to a script slurmtf.run starts, not {what}",
                hint,
            )

    @property
    def fixed_tasks(self) -> int | None:
        """The task count ``--jobs`` fixes (every role counted), else ``None``."""
        if self.jobs is None:
            return None
        counts = [entry.count for entry in roles.parse_jobs(self.jobs, name="--jobs").entries]
        return None if None in counts else sum(c for c in counts if c is not None)

    @property
    def tasks_per_node(self) -> int:
        """One task per ``gpus_per_task`` GPUs; one task per node without GPUs."""
        return max(1, self.gpus_per_node // self.gpus_per_task)

    @property
    def num_tasks(self) -> int:
        """The tasks on the fewest nodes the job may get (``--jobs`` fixes them all)."""
        return self.fixed_tasks or self.nodes * self.tasks_per_node

    @property
    def is_range(self) -> bool:
        """A ``--nodes=MIN-MAX`` job: as many nodes as Slurm can give in the range."""
        return self.max_nodes > self.nodes

    @property
    def node_count(self) -> str:
        """``--nodes`` as sbatch reads it: ``2`` or ``2-4``."""
        return f"{self.nodes}-{self.max_nodes}" if self.is_range else str(self.nodes)

    @property
    def most_tasks(self) -> int:
        """The tasks on the most nodes the job may get."""
        return max(self.nodes, self.max_nodes) * self.tasks_per_node

    @property
    def grid(self) -> list[dict[str, str]]:
        """The sweep's points (the grid, or ``samples`` random points from ``sweep_seed``)."""
        return sample_points(self.sweep, self.samples, self.sweep_seed)

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


# The lines a job's script runs before its srun: the supervisor (`slurmtf job submitit`,
# slurmtf/runtime/job/supervisor.py) stands in for submitit's `srun`, so that the step can run
# again in place (the same pickled job, the same log files) on the nodes it leaves. It
# runs with the interpreter of the submit (`python`), which imports slurmtf.
SUPERVISOR_LINES = (
    "# srun: slurmtf's supervisor runs the step, restarts it in place, requeues and ends",
    "# with the job's status (slurmtf job submitit ... -- SRUN ARGS); a checkout's slurmtf",
    "# first (SLURMTF_REPO or the submit directory), as in the job scripts.",
    'REPO="${SLURMTF_REPO:-${SLURM_SUBMIT_DIR:-$PWD}}"',
    'if [ -f "$REPO/slurmtf/__init__.py" ]; then '
    'export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"; fi',
)


def rank_python(spec: JobSpec, host: str) -> str:
    """The ranks' interpreter: the image's behind a container prefix (``--container_python``,
    else ``python3``: the submitting interpreter's path is missing there, or is the host's
    seen through a bind, without the image's TensorFlow); else ``host``."""
    return (spec.container_python or "python3") if spec.container_prefix else host


def supervisor_setup(spec: JobSpec, python: str) -> list[str]:
    """Setup lines that hand submitit's srun line to the supervisor with the options the
    job asks for; none when it asks for none (then submitit's srun runs as it is)."""
    flags = [*node_flags(spec), *stage_flags(spec)]
    if spec.check_first:
        flags.append("--check_first")
    if spec.container_prefix:
        flags.append(f"--container={spec.container_prefix}")
    if spec.container_python:
        flags.append(f"--container_python={spec.container_python}")
    if not (spec.max_requeues or flags):
        return []
    flags = [f"--log_dir={spec.folder}", f"--max_restarts={spec.max_requeues}",
             *budget_flags(spec), *flags]  # fmt: skip
    command = shlex.join([python, "-m", "slurmtf", "job", "submitit", *flags, "--"])
    return [*SUPERVISOR_LINES, f'srun() {{ exec {command} "$@"; }}']


def budget_flags(spec: JobSpec) -> list[str]:
    """The supervisor's flags for what ``--max_restarts`` counts, when not the default."""
    flags = [f"--restart_budget={spec.restart_budget}"]
    if spec.restart_budget == DEFAULT_MODE:
        flags = []
    if spec.max_failures_per_hour:
        flags.append(f"--max_failures_per_hour={spec.max_failures_per_hour}")
    return flags if spec.max_requeues else []


def node_flags(spec: JobSpec) -> list[str]:
    """What the supervisor needs to go on without a lost node: ``--spare_nodes`` (the
    allocation holds that many more than the step trains on) and, for a
    ``--nodes=MIN-MAX`` range, ``--min_nodes`` (the fewest to go on with)."""
    if not spec.max_requeues:
        return []
    flags = [f"--spare_nodes={spec.spare_nodes}"] if spec.spare_nodes else []
    return flags + ([f"--min_nodes={spec.nodes}"] if spec.is_range else [])


def staged_source(spec: JobSpec) -> str:
    """The ``--data_dir`` that ``--stage_data`` copies to every node: the last
    ``--data_dir=DIR`` or ``--data_dir DIR`` of the model's (or script's) arguments, those
    of ``--command`` included."""
    words = [*shlex.split(spec.target), *spec.args] if spec.kind == "command" else spec.args
    found = ""
    for before, word in zip(["", *words], words, strict=False):
        if word.startswith("--data_dir="):
            found = word.partition("=")[2]
        elif before == "--data_dir":
            found = word
    if not found:
        raise InputError(
            "--stage_data",
            True,
            "needs the data set's shared folder as the model's --data_dir",
            "e.g. --stage_data -- --data_dir=/shared/data/mnist",
        )
    return str(Path(found).expanduser().absolute())


def stage_flags(spec: JobSpec) -> list[str]:
    """Stage ``--data_dir`` once per node before the tasks start (and remove the copies at
    the end): the supervisor's ``--stage_data``."""
    if not spec.stage_data:
        return []
    return ["--stage_data", f"--data_dir={staged_source(spec)}"]


def sbatch_parameters(spec: JobSpec, python: str = "python3") -> dict[str, Any]:
    """The parameters of submitit's ``SlurmExecutor.update_parameters`` for ``spec``."""
    params: dict[str, Any] = {
        "job_name": spec.job_name,
        "time": spec.time_min,
        "nodes": spec.nodes,  # a range's minimum: submitit counts tasks with it
        "signal_delay_s": spec.warning_s,
        "array_parallelism": spec.array_parallelism,
        # A failed rank stops the others instead of idling until the time limit; in a
        # --jobs job the chief's script decides (a killed worker is tolerated).
        "srun_args": [f"--kill-on-bad-exit={0 if spec.jobs else 1}"],
    }
    if spec.is_range:  # the step's task count, on the nodes Slurm gave (range_parameters)
        params["srun_args"].append(f"--ntasks-per-node={spec.tasks_per_node}")
    elif spec.fixed_tasks is None:  # --jobs counts every task: --ntasks, not per node
        params["ntasks_per_node"] = spec.tasks_per_node
    gpus, bind = gpu_parameters(spec)
    params.update(gpus)
    params["srun_args"] += bind
    for key in ("cpus_per_task", "mem", "partition", "account", "qos", "constraint"):
        value = getattr(spec, key)
        if value is not None:
            params[key] = value
    if spec.exclusive:
        params["exclusive"] = True
    ranged = range_parameters(spec)
    roles_line = [] if spec.jobs is None else [f"export SLURMTF_JOBS={shlex.quote(spec.jobs)}"]
    setup = [*spec.setup, *roles_line, *supervisor_setup(spec, python)]
    if setup:
        params["setup"] = setup
    extra: dict[str, Any] = {"signal": f"{spec.signal}@{spec.warning_s}"}
    # Requeueable, so that `scontrol requeue` (after exit 75) and node failures restart it.
    extra["requeue" if spec.max_requeues else "no-requeue"] = True
    extra.update(node_failure_parameters(spec, params["srun_args"]))
    extra.update(ranged)
    if spec.fixed_tasks is not None:
        extra["ntasks"] = spec.fixed_tasks
    if spec.cpus_per_gpu is not None:  # submitit's own parameter warns unless --gpus-per-task
        extra["cpus-per-gpu"] = spec.cpus_per_gpu
    extra.update({k: (v if v else True) for k, v in spec.sbatch_extra})
    params["additional_parameters"] = extra
    return params


def gpu_parameters(spec: JobSpec) -> tuple[dict[str, Any], list[str]]:
    """submitit's one GPU parameter (as ``--gpu_flag`` says) and srun's per-task binding,
    unless the job's own options chose one; none without GPUs."""
    if not spec.gpus_per_node:
        return {}, []
    if spec.gpu_flag == "gres":
        params: dict[str, Any] = {"gres": f"gpu:{spec.gpus_per_node}"}
    elif spec.gpu_flag == "gpus-per-node":
        params = {"gpus_per_node": spec.gpus_per_node}
    else:
        params = {"gpus_per_task": spec.gpus_per_task}
    chosen = any(  # the user's own binding (tres-*: Slurm 23.11+'s spelling)
        key in {"gpu-bind", "gpus-per-task", "tres-bind"}
        or (key == "tres-per-task" and "gres/gpu" in value)
        for key, value in spec.sbatch_extra
    )
    if spec.gpu_flag == "gpus-per-task" or spec.tasks_per_node < 2 or chosen:
        return params, []
    # Slurm binds each task to its own GPUs (Slurm 21.08+); slurmtf checks it.
    return params, [f"--gpu-bind=per_task:{spec.gpus_per_task}"]


def node_failure_parameters(spec: JobSpec, srun_args: list[str]) -> dict[str, Any]:
    """sbatch options for a failed node: ``--no-kill`` (the job and its other nodes go on)
    unless ``--kill_on_node_failure`` or ``--max_restarts=0`` (then no supervisor runs the
    job, and nothing would go on without the node: Slurm's default ends the job rather
    than hold its other nodes); with ``--spare_nodes=K``, N+K nodes of which the step
    (``srun_args``, extended here) trains on N."""
    keep = spec.no_kill and spec.max_requeues > 0
    extra: dict[str, Any] = {"no-kill": True} if keep else {}
    if spec.spare_nodes:
        extra["nodes"] = spec.nodes + spec.spare_nodes
        srun_args += [f"--nodes={spec.nodes}", f"--ntasks={spec.num_tasks}"]
    return extra


def range_parameters(spec: JobSpec) -> dict[str, Any]:
    """A ``--nodes=MIN-MAX`` job asks no task count: Slurm fixes one at submission from
    the minimum and then caps the nodes with it (sbatch --nodes=2-3 --ntasks-per-node=1
    gets 2 of 3 idle nodes). The srun step sets the tasks per node on the nodes it got,
    and ``--mincpus`` gives each node the CPUs for them: the sbatch options here."""
    if not spec.is_range:
        return {}
    extra: dict[str, Any] = {"nodes": spec.node_count}
    cpus = spec.tasks_per_node * (spec.cpus_per_task or 1)
    if cpus > 1:
        extra["mincpus"] = cpus
    return extra


def _has_flag(args: Sequence[str], name: str) -> bool:
    return any(a == f"--{name}" or a.startswith(f"--{name}=") for a in args)


def chief_done_file(spec: JobSpec, job_id: str, restart: int) -> Path:
    """The file the chief's launcher writes when its script ends (a ``--jobs`` job): the
    servers stop on it even when the chief failed before its server ever answered. One
    per attempt, so that a requeued job's servers do not stop on the last one's."""
    return spec.folder / f"{job_id}_chief_done.{restart}"


def task_command(
    spec: JobSpec,
    params: Mapping[str, str],
    python: str = "python3",
    job_id: str = "%j",
    restart: int = 0,
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
    if spec.jobs is not None:  # ps/worker tasks serve; the chief runs the script as it is
        chief = [python, "-u", "-m", spec.target]
        if spec.kind == "command":
            chief = shlex.split(spec.target)
        done = f"--done_file={chief_done_file(spec, job_id, restart)}"
        return [python, "-u", "-m", SERVE, done, "--", *chief, *spec.args, *sweep_args]
    flag = ["--cluster_flags"] if spec.cluster_flags else []
    if spec.kind == "module":
        return [python, "-u", "-m", RUN_LAUNCHER, *flag, "-m", spec.target, *spec.args, *sweep_args]
    if spec.kind == "command":
        words = through_launcher(shlex.split(spec.target))
        if flag:  # right after `-m slurmtf.run`, before the script
            at = words.index(RUN_LAUNCHER) + 1
            words = [*words[:at], *flag, *words[at:]]
        return [*words, *spec.args, *sweep_args]
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


def through_launcher(words: Sequence[str]) -> list[str]:
    """``python [OPTS] (SCRIPT | -m MODULE) ARGS`` -> the same through
    ``python [OPTS] -m slurmtf.run``, which exports TF_CONFIG and applies slurmtf's
    TensorFlow and Keras fixes before the script's first line; any other command (a
    shell script, ``python -c``) is returned unchanged."""
    words = list(words)
    if not words or not _PYTHON.fullmatch(Path(words[0]).name):
        return words
    i = 1
    while i < len(words) and words[i].startswith("-") and not words[i].startswith(("-m", "-c")):
        if words[i] == "-":
            return words
        i += 2 if words[i] in ("-W", "-X") else 1
    if i >= len(words) or words[i].startswith("-c") or words[i + 1 : i + 2] == [RUN_LAUNCHER]:
        return words
    return [*words[:i], "-m", RUN_LAUNCHER, *words[i:]]


def render_sbatch(spec: JobSpec, python: str, *, map_count: int | None = None) -> str:
    """The exact sbatch script submitit writes for ``spec`` (same renderer, same command).

    ``python`` is the interpreter's path; it is quoted here, as submitit quotes
    ``sys.executable``.
    """
    from submitit.slurm import slurm as submitit_slurm

    params = sbatch_parameters(spec, python)
    if map_count is not None and map_count > 1:
        params["map_count"] = map_count
    command = " ".join(
        [shlex.quote(python), "-u -m submitit.core._submit", shlex.quote(str(spec.folder))]
    )
    text: str = submitit_slurm._make_sbatch_string(command=command, folder=spec.folder, **params)
    return text
