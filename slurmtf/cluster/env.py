"""The one reader of the environment: Slurm's variables (and ours) into a frozen value.

Everything after :func:`read_slurm_env` is a pure function of :class:`SlurmEnv`.
Values stay raw strings here; :mod:`slurmtf.cluster.layout` parses and validates them and its
errors name the variable each value came from.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmtf.errors import InputError

log = logging.getLogger(__name__)

# A hostfile lists one host per rank; 16 MiB is far above 100k ranks of long names.
MAX_HOSTFILE_BYTES = 16 * 1024 * 1024

STEP_VARS = ("SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS")
JOB_VARS = ("SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS")
# Older names Slurm still sets; read only when the current name is missing.
_OLD_NAMES = {"SLURM_JOB_NODELIST": "SLURM_NODELIST", "SLURM_NTASKS": "SLURM_NPROCS"}
# A heterogeneous job's components: how many, and each one's nodes and job id.
HET_SIZE_VAR = "SLURM_HET_SIZE"
HET_NODELIST_VAR = "SLURM_JOB_NODELIST_HET_GROUP_{}"
HET_JOB_ID_VAR = "SLURM_JOB_ID_HET_GROUP_{}"
# The older spelling: Slurm 22.05 still sets only these in a het job made by `srun A : B`.
_OLD_HET = {"HET_GROUP": "PACK_GROUP", "HET_SIZE": "PACK_SIZE"}
# Far above any real job; a guard against a mistyped SLURM_HET_SIZE.
MAX_HET_COMPONENTS = 1024


@dataclass(frozen=True)
class SlurmEnv:
    """What a Slurm task (or a process outside Slurm) sees, as raw strings.

    ``scope`` is ``"step"`` when the ``SLURM_STEP_*`` variables were found, ``"job"``
    when the job's were used instead, ``"none"`` outside Slurm. The ``*_var`` fields
    name the variable each value came from, for messages. In a heterogeneous job,
    ``het_size`` is ``SLURM_HET_SIZE`` and ``het_nodelists[N]`` / ``het_job_ids[N]`` are
    component ``N``'s ``SLURM_JOB_NODELIST_HET_GROUP_N`` / ``SLURM_JOB_ID_HET_GROUP_N``.
    ``jobs`` is ``SLURMTF_JOBS`` (roles, :mod:`slurmtf.cluster.roles`); ``resv_ports``
    is ``SLURM_STEP_RESV_PORTS`` (Slurm's reserved ports of the step) and ``resv_mode``
    ``SLURMTF_RESV_PORTS`` (whether to use them, :mod:`slurmtf.cluster.ports`).
    """

    scope: str = "none"
    nodelist: str | None = None
    nodelist_var: str = "SLURM_STEP_NODELIST"
    tasks_per_node: str | None = None
    tasks_per_node_var: str = "SLURM_STEP_TASKS_PER_NODE"
    num_tasks: str | None = None
    num_tasks_var: str = "SLURM_STEP_NUM_TASKS"
    procid: str | None = None
    localid: str | None = None
    nodeid: str | None = None
    nodename: str | None = None
    job_id: str | None = None
    array_job_id: str | None = None
    array_task_id: str | None = None
    het_job_id: str | None = None
    het_job_offset: str | None = None
    restart_count: str | None = None
    distribution: str | None = None
    plane_size: str | None = None
    hostfile: str | None = None
    hostfile_text: str | None = None
    port_base: str | None = None
    resv_ports: str | None = None
    resv_mode: str | None = None
    address_template: str | None = None
    cuda_visible_devices: str | None = None
    slurm_gpus: str | None = None
    slurm_gpus_var: str = "SLURM_STEP_GPUS"
    gpus_on_node: str | None = None
    job_gpus: str | None = None
    gpu_split: str | None = None
    tres_bind: str | None = None
    gpu_bind: str | None = None
    tres_per_task: str | None = None
    gpus_per_task: str | None = None
    jobs: str | None = None
    het_size: str | None = None
    het_nodelists: tuple[str | None, ...] = ()
    het_job_ids: tuple[str | None, ...] = ()

    def __post_init__(self) -> None:
        if self.scope not in {"step", "job", "none"}:
            raise InputError("scope", self.scope, "is not step, job or none", "use one of them")

    @property
    def in_slurm(self) -> bool:
        """True inside a Slurm job (a node list or a job id is set)."""
        return self.nodelist is not None or self.job_id is not None

    @property
    def job_label(self) -> str:
        """The id that names a job's files, as submitit and ``sacct`` spell it:
        ``ARRAYID_TASKID`` for an array task, else the job id (``local`` outside Slurm)."""
        if self.array_job_id and self.array_task_id:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id or "local"

    @property
    def sources(self) -> tuple[str, ...]:
        """The variables that describe the allocation, as read."""
        if self.scope == "none":
            return ()
        names = (self.nodelist_var, self.tasks_per_node_var)
        return (*names, self.num_tasks_var) if self.num_tasks is not None else names


def read_slurm_env(environ: Mapping[str, str] = os.environ) -> SlurmEnv:
    """Read every variable slurmtf uses, step variables first, job variables as fallback.

    The hostfile of ``--distribution=arbitrary`` (``SLURM_HOSTFILE``) is read here too,
    so that the rest of the package never touches the file system.
    """
    get = _getter(environ)
    env = SlurmEnv(
        **_allocation(get, environ),
        **_task(get),
        **_placement(get),
        **_gpus(get),
        **_settings(get),
        **_het_groups(get),
    )
    if env.scope == "none":
        log.debug("no SLURM_STEP_NODELIST or SLURM_JOB_NODELIST: not in a Slurm step")
    else:
        log.debug("Slurm %s variables used: %s", env.scope, ", ".join(env.sources))
    return env


def _getter(environ: Mapping[str, str]) -> Callable[[str], str | None]:
    """A reader of one variable: an older name Slurm still sets stands in for a missing one."""

    def get(name: str) -> str | None:
        value = environ.get(name)
        if value is None and name in _OLD_NAMES:
            value = environ.get(_OLD_NAMES[name])
        return value

    return get


def _allocation(get: Callable[[str], str | None], environ: Mapping[str, str]) -> dict[str, Any]:
    """The step's node list, tasks per node and task count (else the job's), and the
    variable each came from."""
    scope, names = _scope(get)

    def actual(name: str) -> str:
        """The name really set: ``name`` or, when only that is set, its older name."""
        old = _OLD_NAMES.get(name)
        return old if old is not None and name not in environ and old in environ else name

    nodelist_var, tasks_var, num_var = (actual(name) for name in names)
    return {
        "scope": scope,
        "nodelist": get(nodelist_var),
        "nodelist_var": nodelist_var,
        "tasks_per_node": get(tasks_var),
        "tasks_per_node_var": tasks_var,
        "num_tasks": get(num_var),
        "num_tasks_var": num_var,
    }


def _task(get: Callable[[str], str | None]) -> dict[str, Any]:
    """This task (its rank, on its node) and its job (ids, restarts)."""
    return {
        "procid": get("SLURM_PROCID"),
        "localid": get("SLURM_LOCALID"),
        "nodeid": get("SLURM_NODEID"),
        "nodename": get("SLURMD_NODENAME"),
        "job_id": get("SLURM_JOB_ID") or get("SLURM_JOBID"),
        "array_job_id": get("SLURM_ARRAY_JOB_ID"),
        "array_task_id": get("SLURM_ARRAY_TASK_ID"),
        "het_job_id": get("SLURM_HET_JOB_ID"),
        "het_job_offset": get("SLURM_HET_JOB_OFFSET"),
        "restart_count": get("SLURM_RESTART_COUNT"),
    }


def _placement(get: Callable[[str], str | None]) -> dict[str, Any]:
    """How Slurm distributes the tasks; the hostfile's text under ``arbitrary``."""
    distribution = get("SLURM_DISTRIBUTION")
    hostfile = get("SLURM_HOSTFILE")
    hostfile_text = None
    if hostfile is not None and _node_level(distribution) == "arbitrary":
        hostfile_text = _read_hostfile(hostfile)
    return {
        "distribution": distribution,
        "plane_size": get("SLURM_DIST_PLANESIZE"),
        "hostfile": hostfile,
        "hostfile_text": hostfile_text,
    }


def _gpus(get: Callable[[str], str | None]) -> dict[str, Any]:
    """The GPUs Slurm gives the step (else the job) and the node, and how to split them."""
    only_job_gpus = get("SLURM_STEP_GPUS") is None and get("SLURM_JOB_GPUS") is not None
    slurm_gpus_var = "SLURM_JOB_GPUS" if only_job_gpus else "SLURM_STEP_GPUS"
    return {
        "cuda_visible_devices": get("CUDA_VISIBLE_DEVICES"),
        "slurm_gpus": get(slurm_gpus_var),
        "slurm_gpus_var": slurm_gpus_var,
        "gpus_on_node": get("SLURM_GPUS_ON_NODE"),
        "job_gpus": get("SLURM_JOB_GPUS"),
        "gpu_split": get("SLURMTF_GPU_SPLIT"),
        # How the job asked its tasks' GPUs. Slurm 23.11+ exports the TRES forms
        # (SLURM_TRES_BIND=gres/gpu:closest, SLURM_TRES_PER_TASK=gres/gpu=1 or cpu=4),
        # older releases SLURM_GPU_BIND and SLURM_GPUS_PER_TASK: both are kept, the newer
        # read first (slurmtf.cluster.step_flags).
        "tres_bind": get("SLURM_TRES_BIND"),
        "gpu_bind": get("SLURM_GPU_BIND"),
        "tres_per_task": get("SLURM_TRES_PER_TASK"),
        "gpus_per_task": get("SLURM_GPUS_PER_TASK"),
    }


def _settings(get: Callable[[str], str | None]) -> dict[str, Any]:
    """slurmtf's own variables (ports, addresses, roles) and Slurm's reserved ports."""
    return {
        "port_base": get("SLURMTF_PORT_BASE"),
        "resv_ports": get("SLURM_STEP_RESV_PORTS"),
        "resv_mode": get("SLURMTF_RESV_PORTS"),
        "address_template": get("SLURMTF_ADDRESS_TEMPLATE"),
        "jobs": get("SLURMTF_JOBS"),
    }


def _het_groups(get: Callable[[str], str | None]) -> dict[str, Any]:
    """``SLURM_HET_SIZE`` and, per component ``N``, its node list and job id (raw)."""

    def het(name: str) -> str | None:
        value = get(name)
        if value is None:
            for new, old in _OLD_HET.items():
                name = name.replace(new, old)
            value = get(name)
        return value

    size = het(HET_SIZE_VAR)
    if size is None:
        return {}
    text = size.strip()
    count = int(text) if text.isascii() and text.isdigit() and len(text) < 6 else 0
    if not 1 <= count <= MAX_HET_COMPONENTS:
        raise InputError(
            HET_SIZE_VAR,
            size,
            f"is not a component count between 1 and {MAX_HET_COMPONENTS}",
            "launch the task with srun inside the job, and do not edit Slurm's variables",
        )
    return {
        "het_size": size,
        "het_nodelists": tuple(het(HET_NODELIST_VAR.format(n)) for n in range(count)),
        "het_job_ids": tuple(het(HET_JOB_ID_VAR.format(n)) for n in range(count)),
    }


def _scope(get: Callable[[str], str | None]) -> tuple[str, tuple[str, str, str]]:
    """``step`` variables when srun set them, else the ``job``'s, else ``none``."""
    if get("SLURM_STEP_NODELIST") is not None:
        return "step", STEP_VARS
    if get("SLURM_JOB_NODELIST") is not None:
        return "job", JOB_VARS
    return "none", STEP_VARS


def _node_level(distribution: str | None) -> str:
    """The node-level part of ``SLURM_DISTRIBUTION`` (``cyclic:block,pack`` -> ``cyclic``)."""
    if not distribution:
        return ""
    return distribution.split(",", 1)[0].split(":", 1)[0].strip().lower()


def _read_hostfile(path: str) -> str:
    hint = "point SLURM_HOSTFILE at a readable text file with one host name per task"
    try:
        with Path(path).open("rb") as stream:
            data = stream.read(MAX_HOSTFILE_BYTES + 1)
    except OSError as exc:
        raise InputError("SLURM_HOSTFILE", path, f"cannot be read ({exc.strerror})", hint) from exc
    except ValueError as exc:  # e.g. a NUL byte in the path
        raise InputError("SLURM_HOSTFILE", path, f"is not a valid path ({exc})", hint) from exc
    if len(data) > MAX_HOSTFILE_BYTES:
        raise InputError("SLURM_HOSTFILE", path, "is larger than 16 MiB", hint)
    try:
        return data.decode("ascii")
    except UnicodeDecodeError as exc:
        raise InputError("SLURM_HOSTFILE", path, "is not a plain ASCII text file", hint) from exc
