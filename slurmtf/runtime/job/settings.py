"""What the supervisor of a batch job knows before its first step: the job's settings.

One reader (:meth:`JobSettings.read`) turns the batch script's environment (Slurm's
variables and the settings the job scripts document: ``MODEL_DIR``, ``LOG_DIR``,
``PYTHON``, ``CONTAINER``, ``MAX_RESTARTS``, ``RESTART_BUDGET``, ``MAX_FAILURES_PER_HOUR``,
``SPARE_NODES``, ``MIN_NODES``,
``TASKS_PER_NODE``, ``STAGE_DATA``, ...) into one frozen value; everything after it
takes values. The step's task and CPU flags and its GPU binding are functions of it
(:mod:`slurmtf.runtime.job.srun_flags`).
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from pathlib import Path

from slurmtf.cluster.env import SlurmEnv, read_slurm_env
from slurmtf.cluster.ports import parse_resv_mode
from slurmtf.contracts import NODE_EVENTS_NAME
from slurmtf.errors import InputError, SlurmtfError
from slurmtf.runtime.recovery.budget import DEFAULT_MODE, Policy, parse_mode

# The kinds of job the supervisor runs: the bundled models, a user's script (train),
# a ParameterServerStrategy job, any command (users' own scripts through job.sh), and
# the step of a job `slurmtf submit` wrote (submitit's srun line).
MODEL_KINDS = ("mnist", "resnet")
WARM_ENV = "SLURMTF_WARM_STANDBY"  # when the next attempt's ranks start early
WARM_MODES = ("auto", "1", "0")
JOB_KINDS = (*MODEL_KINDS, "train", "parameter_server", "command", "submitit")
# The kinds whose chief starts through slurmtf (slurmtf.run, serve, the submit launcher,
# the bundled models' trackers), which gives it the job's MLflow run: the supervisor
# looks that run up for these alone.
TRACKED_KINDS = (*MODEL_KINDS, "train", "parameter_server", "submitit")
# The interpreter ranks run behind a container prefix unless CONTAINER_PYTHON names one.
CONTAINER_PYTHON = "python3"


class JobStop(SlurmtfError):
    """The job ends before training with ``status`` (2: it cannot train as set up)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class LogNames:
    """How rank R's files are named: ``<prefix>R<suffix>.out|.err`` in the log folder
    (``rank%t`` for the job scripts, submitit's ``<job>_%t_log``), the pattern
    ``slurmtf status`` reads, and the file srun's stderr is appended to."""

    prefix: str = "rank"
    suffix: str = ""
    pattern: str = "rank{rank}.{kind}"
    srun_err: str = "srun.err"


@dataclasses.dataclass(frozen=True)
class JobSettings:
    kind: str
    job_id: str  # "local" outside Slurm
    job_name: str
    repo: Path
    model_dir: Path
    log_dir: Path
    python: tuple[str, ...]  # PYTHON, which may hold several words
    container: tuple[str, ...]  # CONTAINER: the prefix of every rank's command
    container_python: tuple[str, ...]  # CONTAINER_PYTHON: the ranks' interpreter behind it
    budget: int  # MAX_RESTARTS (MAX_REQUEUES, its former name)
    requeues: int  # SLURM_RESTART_COUNT
    nodelist: str
    num_nodes: int
    ntasks: str  # SLURM_NTASKS: the job asked a task count ("" when not)
    ntasks_per_node: str
    gpus_on_node: str
    slurm: SlurmEnv  # the batch step's Slurm variables (GPU binding: slurmtf.cluster.step_flags)
    job_cpus_per_node: str
    cpus_per_task: str
    tasks_per_node: str  # TASKS_PER_NODE
    het_size: int
    spare_nodes: str
    min_nodes: str
    stage: bool  # STAGE_DATA=1
    data_dir: str
    export_dir: str
    check_first: bool
    node_watch: bool  # SLURMTF_NODE_WATCH
    watch_s: float  # SLURMTF_NODE_WATCH_S: how often the supervisor looks at the ranks
    probe_s: float  # SLURMTF_NODE_PROBE_S
    beat_s: float  # SLURMTF_HEARTBEAT_S: the supervisor's heartbeat for its keeper and watcher
    watcher: bool  # SLURMTF_WATCHER: a watcher step on another node (for the batch host)
    in_place: bool  # SLURMTF_RESTART_IN_PLACE (0: a restart in place is a requeue)
    legacy_keras: bool
    cluster_flags: bool
    roles: str  # SLURMTF_JOBS of a parameter-server job
    serve_args: tuple[str, ...]
    srun_args: tuple[str, ...] = ()  # SRUN_ARGS: more options of every training step
    resv_mode: bool | None = None  # SLURMTF_RESV_PORTS: ask srun for reserved ports
    logs: LogNames = LogNames()
    servers: bool = False  # a parameter-server step of the command kind (job.sh's ps_srun)
    budget_mode: str = DEFAULT_MODE  # RESTART_BUDGET: what MAX_RESTARTS counts
    failures_per_hour: int = 0  # MAX_FAILURES_PER_HOUR (0: no limit)
    warm: str = "auto"  # SLURMTF_WARM_STANDBY: when the next attempt's ranks start early

    @property
    def policy(self) -> Policy:
        """The restart budget (slurmtf.runtime.recovery.budget)."""
        return Policy(self.budget, self.budget_mode, self.failures_per_hour)

    @property
    def rank_python(self) -> tuple[str, ...]:
        """The ranks' interpreter: the image's (CONTAINER_PYTHON, ``python3``) behind a
        container prefix, where the host's PYTHON is missing or has none of the image's
        packages; else PYTHON."""
        return self.container_python if self.container else self.python

    @classmethod
    def read(cls, kind: str, environ: Mapping[str, str]) -> JobSettings:
        """The settings of a ``kind`` job from the batch script's environment."""
        env = dict(environ)
        if env.get("SLURMTF_MIN_NODES"):
            value = env["SLURMTF_MIN_NODES"]
            raise InputError(
                "SLURMTF_MIN_NODES", value, "is not read",
                f"name the fewest nodes to go on with MIN_NODES={value}",
            )  # fmt: skip
        job_id = env.get("SLURM_JOB_ID") or "local"
        repo = Path(env.get("SLURMTF_REPO") or env.get("SLURM_SUBMIT_DIR") or Path.cwd())
        run = f"{env.get('SLURM_JOB_NAME') or kind}-{job_id}"
        model_dir = Path(env.get("MODEL_DIR") or repo / "runs" / run)
        return cls(
            kind=kind, job_id=job_id, job_name=env.get("SLURM_JOB_NAME", ""), repo=repo,
            model_dir=model_dir, log_dir=Path(env.get("LOG_DIR") or repo / "logs" / run),
            python=_words("PYTHON", env.get("PYTHON") or "python3"),
            container=_words("CONTAINER", env.get("CONTAINER", ""), empty=True),
            container_python=_words(
                "CONTAINER_PYTHON", env.get("CONTAINER_PYTHON") or CONTAINER_PYTHON
            ),
            budget=_int("MAX_RESTARTS", env.get("MAX_RESTARTS") or env.get("MAX_REQUEUES") or "3"),
            budget_mode=parse_mode(env.get("RESTART_BUDGET", "")),
            failures_per_hour=_int(
                "MAX_FAILURES_PER_HOUR", env.get("MAX_FAILURES_PER_HOUR") or "0"
            ),
            requeues=_int("SLURM_RESTART_COUNT", env.get("SLURM_RESTART_COUNT") or "0"),
            nodelist=env.get("SLURM_JOB_NODELIST", ""),
            num_nodes=_int("SLURM_JOB_NUM_NODES", env.get("SLURM_JOB_NUM_NODES") or "1"),
            ntasks=env.get("SLURM_NTASKS", ""),
            ntasks_per_node=env.get("SLURM_NTASKS_PER_NODE", ""),
            gpus_on_node=env.get("SLURM_GPUS_ON_NODE", "0"),
            slurm=read_slurm_env(env),
            resv_mode=parse_resv_mode(env.get("SLURMTF_RESV_PORTS")),
            job_cpus_per_node=env.get("SLURM_JOB_CPUS_PER_NODE", ""),
            cpus_per_task=env.get("SLURM_CPUS_PER_TASK", ""),
            tasks_per_node=env.get("TASKS_PER_NODE", ""),
            het_size=_int("SLURM_HET_SIZE", env.get("SLURM_HET_SIZE") or "0"),
            spare_nodes=env.get("SPARE_NODES", ""), min_nodes=env.get("MIN_NODES", ""),
            stage=env.get("STAGE_DATA", "0") == "1", data_dir=env.get("DATA_DIR", ""),
            export_dir=env.get("EXPORT_DIR") or str(model_dir / "export"),
            check_first=env.get("CHECK_FIRST", "0") == "1",
            node_watch=env.get("SLURMTF_NODE_WATCH", "1") == "1",
            watch_s=_seconds("SLURMTF_NODE_WATCH_S", env.get("SLURMTF_NODE_WATCH_S") or "1"),
            probe_s=_seconds("SLURMTF_NODE_PROBE_S", env.get("SLURMTF_NODE_PROBE_S") or "10"),
            beat_s=_seconds("SLURMTF_HEARTBEAT_S", env.get("SLURMTF_HEARTBEAT_S") or "5"),
            watcher=_switch("SLURMTF_WATCHER", env.get("SLURMTF_WATCHER") or "1"),
            in_place=restart_in_place(env.get("SLURMTF_RESTART_IN_PLACE", "1")),
            legacy_keras=env.get("LEGACY_KERAS", "0") == "1",
            cluster_flags=env.get("CLUSTER_FLAGS", "0") == "1",
            roles=env.get("SLURMTF_JOBS") or "chief:1,ps:2,worker",
            serve_args=_words("SERVE_ARGS", env.get("SERVE_ARGS", ""), empty=True),
            srun_args=_words("SRUN_ARGS", env.get("SRUN_ARGS", ""), empty=True),
            warm=warm_mode(env.get(WARM_ENV) or "auto"),
        )  # fmt: skip

    @property
    def in_slurm(self) -> bool:
        return self.job_id != "local"

    def rank_file(self, rank: int | str, kind: str) -> Path:
        return self.log_dir / f"{self.logs.prefix}{rank}{self.logs.suffix}.{kind}"

    @property
    def srun_err(self) -> Path:
        return self.log_dir / self.logs.srun_err

    @property
    def node_events(self) -> str:
        """The ranks' ``SLURMTF_NODE_EVENTS``: one file per node (``%N``) in the log folder."""
        return str(self.log_dir / NODE_EVENTS_NAME.format(job=self.job_id))


def submitit_logs(job_id: str) -> LogNames:
    """The log names of a job ``slurmtf submit`` wrote (submitit's ``%j_%t_log``)."""
    return LogNames(f"{job_id}_", "_log", "{job}_{rank}_log.{kind}", f"{job_id}_0_log.err")


def _words(name: str, text: str, *, empty: bool = False) -> tuple[str, ...]:
    try:
        words = tuple(shlex.split(text))
    except ValueError as exc:
        raise InputError(
            name, text, f"is not a command line ({exc})", "quote it as in bash"
        ) from exc
    if not words and not empty:
        raise InputError(name, text, "is empty", f"leave {name} unset or name a command")
    return words


def _int(name: str, text: str) -> int:
    if not text.strip().isdigit():
        raise InputError(name, text, "is not a whole number", f"e.g. {name}=3")
    return int(text)


def _switch(name: str, text: str) -> bool:
    if text not in ("0", "1"):
        raise InputError(name, text, "must be 1 or 0", f"leave {name} unset (1) or set it to 0")
    return text == "1"


def restart_in_place(text: str) -> bool:
    """``SLURMTF_RESTART_IN_PLACE`` as typed: 1 (restart in place, the default) or 0
    (requeue every failed attempt instead, the path taken before restarts in place)."""
    if text not in ("0", "1"):
        raise InputError(
            "SLURMTF_RESTART_IN_PLACE", text, "must be 1 or 0",
            "leave it unset (restart in place); 0 requeues every failed attempt instead",
        )  # fmt: skip
    return text == "1"


def warm_mode(text: str) -> str:
    """``SLURMTF_WARM_STANDBY`` as typed: ``auto`` (warm ranks once the job has failed),
    ``1`` (from the first step on) or ``0`` (never)."""
    if text not in WARM_MODES:
        raise InputError(
            WARM_ENV, text, "must be auto, 1 or 0",
            "auto starts the next attempt's ranks early once the job has failed, 1 from "
            "its first step, 0 never",
        )  # fmt: skip
    return text


def _seconds(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InputError(name, text, "is not a number of seconds", f"e.g. {name}=1")
    return value
