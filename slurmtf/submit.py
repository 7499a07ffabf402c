"""Submitting a job request: a :class:`JobSpec` from the parsed flags, its dry run, and
submission through submitit (one job, or one job array for a sweep).

The front end, ``python -m slurmtf.submit`` / ``slurmtf submit``, is
:mod:`slurmtf.cli.submit`. Never imports TensorFlow.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from slurmtf.contracts import (
    SUBMITIT_LOG_NAME,
    parse_preemption_signal,
    rank_log_paths,
    signal_name,
)
from slurmtf.errors import InputError, SlurmCommandError, SlurmtfError
from slurmtf.monitor import records as jobrecord
from slurmtf.spec import jobspec
from slurmtf.spec import values as jobvalues
from slurmtf.spec.jobspec import JobSpec
from slurmtf.spec.noderange import parse_nodes

# Flags that become the JobSpec field of the same name unchanged (JobSpec checks them).
_AS_GIVEN = (
    "gpus_per_node", "gpu_flag", "gpus_per_task", "cpus_per_task", "cpus_per_gpu", "mem",
    "partition", "account", "qos", "constraint", "exclusive", "job_name", "log_dir",
    "signal_delay_s", "array_parallelism", "cluster", "legacy_keras", "stage_data",
    "check_first", "jobs", "cluster_flags", "spare_nodes", "container_prefix", "container_python",
    "restart_budget", "max_failures_per_hour",
)  # fmt: skip


def spec_from_args(fv: Any, rest: Sequence[str]) -> JobSpec:
    """Parsed flags (:mod:`slurmtf.cli.submit`) and the arguments after ``--`` -> a JobSpec."""
    kinds = ("model", "module", "function", "command")
    targets = [(k, getattr(fv, k)) for k in kinds if getattr(fv, k)]
    if len(targets) != 1:
        given = ", ".join(f"--{k}" for k, _ in targets) or "none"
        raise InputError(
            "--model/--module/--function/--command", given, "need exactly one", "e.g. --model=mnist"
        )
    kind, target = targets[0][0], str(targets[0][1])
    nodes = parse_nodes(fv.nodes)
    return JobSpec(
        nodes=nodes.low,
        max_nodes=nodes.high if nodes.is_range else 0,
        kind=kind,
        target=target,
        args=tuple(rest),
        time_min=jobvalues.parse_time(fv.time),
        setup=jobvalues.check_setup_with_bash(fv.setup),
        sbatch_extra=jobvalues.parse_extra(fv.sbatch_extra),
        signal=signal_name(parse_preemption_signal(fv.signal, "--signal")),
        max_requeues=fv.max_restarts if fv.max_requeues is None else fv.max_requeues,
        sweep=jobvalues.parse_sweep(fv.sweep),
        samples=fv.samples,
        sweep_seed=fv.seed,
        no_kill=not fv.kill_on_node_failure,
        **{name: getattr(fv, name) for name in _AS_GIVEN},
    )


def shape(spec: JobSpec, by: str, tasks: str) -> str:
    """``3 nodes x 2`` (``by`` and ``tasks`` around the tasks per node), or for ``--jobs``
    ``3 node(s), roles chief:1,ps:2,worker:2``."""
    if spec.jobs is None:
        return f"{spec.node_count} {by}{spec.tasks_per_node}{tasks}"
    return f"{spec.node_count} node(s), roles {spec.jobs}"


def dry_run(spec: JobSpec, python: str, out: TextIO) -> None:
    """Print the sbatch script submitit would write and each task's command."""
    grid = spec.grid
    array = len(grid) if len(grid) > 1 else None
    print(f"# sbatch script ({tasks_text(spec)} tasks: {shape(spec, 'nodes x ', '')})", file=out)
    if array:
        print(f"# job array of {array} tasks", file=out)
    print(jobspec.render_sbatch(spec, python, map_count=array), file=out)
    print("# per-task command (TF_CONFIG is set per task by slurmtf.resolver):", file=out)
    if spec.legacy_keras:
        print(f"# every task runs with {jobspec.LEGACY_KERAS_ENV}=1", file=out)
    rank_python = jobspec.rank_python(spec, python)
    for index, params in enumerate(grid):
        label = f"array task {index} {params}: " if array else ""
        job = "%A_%a" if array else "%j"
        print(
            f"# {label}{shlex.join(jobspec.task_command(spec, params, rank_python, job_id=job))}",
            file=out,
        )


def tasks_text(spec: JobSpec) -> str:
    """``4`` or, for a ``--nodes`` range, ``4-8``."""
    if spec.is_range:
        return f"{spec.num_tasks}-{spec.most_tasks}"
    return str(spec.num_tasks)


def submit_slurm(spec: JobSpec, out: TextIO) -> tuple[str, list[str]]:
    """Submit through submitit; returns (id to wait on, ids naming the log files)."""
    import submitit
    from submitit.core.utils import FailedJobError

    from slurmtf.runtime.rank.launcher import TaskLauncher

    if shutil.which("sbatch") is None:
        raise SlurmtfError(
            "sbatch is not on PATH, so there is no Slurm cluster to submit to. "
            "HINT: run this on a login node, or pass --cluster=local to run local processes"
        )
    spec.folder.mkdir(parents=True, exist_ok=True)
    executor = submitit.SlurmExecutor(folder=spec.folder, max_num_timeout=spec.max_requeues)
    executor.update_parameters(**jobspec.sbatch_parameters(spec, sys.executable))
    grid = spec.grid
    try:
        if len(grid) == 1:
            jobs: list[Any] = [executor.submit(TaskLauncher(spec, grid[0]))]
        else:
            with executor.batch():
                jobs = [executor.submit(TaskLauncher(spec, params)) for params in grid]
    except FailedJobError as exc:
        cause = exc.__cause__
        code = getattr(cause, "returncode", 1)
        raise SlurmCommandError("sbatch", code, str(getattr(cause, "stderr", "") or exc)) from exc
    ids = [str(job.job_id) for job in jobs]
    for job_id, params in zip(ids, grid, strict=True):
        jobrecord.append(job_id, spec.folder, SUBMITIT_LOG_NAME, spec.job_name, params=params)
    main_id = ids[0].split("_")[0] if len(ids) > 1 else ids[0]
    kind = f"job array {main_id} ({len(ids)} tasks)" if len(ids) > 1 else f"job {main_id}"
    print(f"slurmtf: submitted {kind}: {shape(spec, 'node(s) x ', ' task(s)')}", file=out)
    for job_id, params in zip(ids, grid, strict=True):
        label = f" {params}" if params else ""
        print(f"slurmtf: {job_id}{label} logs:", file=out)
        for rank, path in enumerate(rank_log_paths(spec.folder, job_id, spec.num_tasks)):
            print(f"  rank {rank}: {path}", file=out)
        if spec.is_range:
            print(f"  (ranks {spec.num_tasks}-{spec.most_tasks - 1} too, on more nodes)", file=out)
    out.flush()
    return main_id, ids


if __name__ == "__main__":  # `python -m slurmtf.submit`: the front end is slurmtf.cli.submit
    from slurmtf.cli.submit import main

    sys.exit(main())
