"""``python -m slurmtf.submit``: a multi-node TensorFlow job (or a sweep) in one command.

Examples::

    python -m slurmtf.submit --model=mnist --nodes=2 --time=30 --wait -- --train_steps=200
    python -m slurmtf.submit --dry_run --model=mnist --nodes=2 --gpus_per_node=4 --time=30
    python -m slurmtf.submit --module=mypkg.train --sweep=learning_rate=0.1,0.01 --partition=gpu

Flags after ``--`` go to the model (or module, function, command) unchanged. The job
is rendered and submitted by submitit (one job, or one job array for a sweep); each
task runs :mod:`slurmtf.launch`. This module never imports TensorFlow.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from absl import flags

from slurmtf import jobrecord, jobspec, jobvalues
from slurmtf.cli import report_error, underscore_flags
from slurmtf.contracts import (
    DEFAULT_LOG_DIR,
    DEFAULT_PREEMPTION_SIGNAL,
    EXIT_USAGE,
    parse_preemption_signal,
    rank_log_paths,
    signal_name,
)
from slurmtf.errors import InputError, SlurmCommandError, SlurmtfError
from slurmtf.jobspec import JobSpec
from slurmtf.watch import follow


def define_flags(fv: flags.FlagValues) -> None:
    """All submit flags, on a fresh ``FlagValues`` so ``main`` can be called repeatedly."""
    s, i, b, m = (
        flags.DEFINE_string,
        flags.DEFINE_integer,
        flags.DEFINE_bool,
        flags.DEFINE_multi_string,
    )
    s("model", None, f"Bundled model: {', '.join(jobspec.MODELS)}.", flag_values=fv)
    s("module", None, "Run `python -m MODULE` in every task.", flag_values=fv)
    s("function", None, "Call MODULE:FUNCTION(argv) -> int in every task.", flag_values=fv)
    s(
        "command",
        None,
        "Run this command (split like a shell, no shell) in every task.",
        flag_values=fv,
    )
    i("nodes", 1, "Nodes.", flag_values=fv)
    i(
        "gpus_per_node",
        0,
        "GPUs per node; one task per GPU (one task per node without).",
        flag_values=fv,
    )
    i(
        "gpus_per_task",
        1,
        "GPUs of each task (worker): --gpus_per_node/N tasks per node, each bound to its "
        "own GPUs; =--gpus_per_node for one worker per node with several local replicas.",
        flag_values=fv,
    )
    flags.DEFINE_enum(
        "gpu_flag",
        "gres",
        jobspec.GPU_FLAGS,
        "How GPUs are asked for: --gres=gpu:N, --gpus-per-node=N or --gpus-per-task=K.",
        flag_values=fv,
    )
    i("cpus_per_task", None, "CPUs per task.", flag_values=fv)
    s("mem", None, "Memory per node, e.g. 16G.", flag_values=fv)
    s("time", "60", "Time limit: minutes, HH:MM:SS or D-HH:MM.", flag_values=fv)
    s("partition", None, "Partition.", flag_values=fv)
    s("account", None, "Account.", flag_values=fv)
    s("qos", None, "Quality of service.", flag_values=fv)
    s("constraint", None, "Node features, e.g. a100.", flag_values=fv)
    b("exclusive", False, "Whole nodes only.", flag_values=fv)
    m(
        "setup",
        [],
        "A shell line run before the tasks, e.g. 'module load cuda' (repeatable).",
        flag_values=fv,
    )
    m(
        "sbatch_extra",
        [],
        "Another sbatch option as KEY=VALUE, e.g. mail-type=END (repeatable).",
        flag_values=fv,
    )
    s("job_name", "slurmtf", "Job name.", flag_values=fv)
    s(
        "log_dir",
        DEFAULT_LOG_DIR,
        "Folder (shared by the nodes) for per-rank logs and job files.",
        flag_values=fv,
    )
    s(
        "signal",
        DEFAULT_PREEMPTION_SIGNAL,
        "Signal sent before the time limit (NCCL reserves USR1).",
        flag_values=fv,
    )
    i("signal_delay_s", 120, "Seconds before the time limit the signal arrives.", flag_values=fv)
    i(
        "max_restarts",
        3,
        "Requeue the job at most this often, counted across restarts: after a preemption "
        "(exit 75) or a failure a restart may fix (a killed rank, a lost peer or node, a "
        "stall; a failed node is excluded). Bad flags and model errors are not retried.",
        flag_values=fv,
    )
    i("max_requeues", None, "Former name of --max_restarts.", flag_values=fv)
    m(
        "sweep",
        [],
        "NAME=V1,V2,...: one array task per point of the grid (repeatable).",
        flag_values=fv,
    )
    i("array_parallelism", 256, "Array tasks running at once.", flag_values=fv)
    b(
        "legacy_keras",
        False,
        "Set TF_USE_LEGACY_KERAS=1 in every task (tf.keras is tf_keras; slurmtf[keras2]).",
        flag_values=fv,
    )
    flags.DEFINE_enum(
        "cluster", "slurm", jobspec.CLUSTERS, "slurm, or local processes.", flag_values=fv
    )
    b(
        "dry_run",
        False,
        "Print the sbatch script and per-task command; submit nothing.",
        flag_values=fv,
    )
    b(
        "wait",
        False,
        "Follow rank 0's log until the job ends; exit with its status.",
        flag_values=fv,
    )


def spec_from_flags(fv: flags.FlagValues, rest: Sequence[str]) -> JobSpec:
    """Flag values (and the arguments after ``--``) -> a validated :class:`JobSpec`."""
    targets = [(k, fv[k].value) for k in ("model", "module", "function", "command") if fv[k].value]
    if len(targets) != 1:
        given = ", ".join(f"--{k}" for k, _ in targets) or "none"
        raise InputError(
            "--model/--module/--function/--command", given, "need exactly one", "e.g. --model=mnist"
        )
    kind, target = targets[0][0], str(targets[0][1])
    return JobSpec(
        kind=kind,
        target=target,
        args=tuple(rest),
        nodes=fv.nodes,
        gpus_per_node=fv.gpus_per_node,
        gpu_flag=fv.gpu_flag,
        gpus_per_task=fv.gpus_per_task,
        cpus_per_task=fv.cpus_per_task,
        mem=fv.mem,
        time_min=jobvalues.parse_time(fv.time),
        partition=fv.partition,
        account=fv.account,
        qos=fv.qos,
        constraint=fv.constraint,
        exclusive=fv.exclusive,
        setup=jobvalues.check_setup(fv.setup),
        sbatch_extra=jobvalues.parse_extra(fv.sbatch_extra),
        job_name=fv.job_name,
        log_dir=fv.log_dir,
        signal=signal_name(parse_preemption_signal(fv.signal, "--signal")),
        signal_delay_s=fv.signal_delay_s,
        max_requeues=fv.max_restarts if fv.max_requeues is None else fv.max_requeues,
        sweep=jobvalues.parse_sweep(fv.sweep),
        array_parallelism=fv.array_parallelism,
        cluster=fv.cluster,
        legacy_keras=fv.legacy_keras,
    )


def dry_run(spec: JobSpec, python: str, out: TextIO) -> None:
    """Print the sbatch script submitit would write and each task's command."""
    grid = spec.grid
    array = len(grid) if len(grid) > 1 else None
    print(
        f"# sbatch script ({spec.num_tasks} tasks: {spec.nodes} nodes x {spec.tasks_per_node})",
        file=out,
    )
    if array:
        print(f"# job array of {array} tasks", file=out)
    print(jobspec.render_sbatch(spec, python, map_count=array), file=out)
    print("# per-task command (TF_CONFIG is set per task by slurmtf.resolver):", file=out)
    if spec.legacy_keras:
        print(f"# every task runs with {jobspec.LEGACY_KERAS_ENV}=1", file=out)
    for index, params in enumerate(grid):
        label = f"array task {index} {params}: " if array else ""
        job = "%A_%a" if array else "%j"
        print(
            f"# {label}{shlex.join(jobspec.task_command(spec, params, python, job_id=job))}",
            file=out,
        )


def submit_slurm(spec: JobSpec, out: TextIO) -> tuple[str, list[str]]:
    """Submit through submitit; returns (id to wait on, ids naming the log files)."""
    import submitit
    from submitit.core.utils import FailedJobError

    from slurmtf.launch import TaskLauncher

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
    for job_id in ids:
        jobrecord.append(job_id, spec.folder, jobrecord.SUBMITIT_LOGS, spec.job_name)
    main_id = ids[0].split("_")[0] if len(ids) > 1 else ids[0]
    kind = f"job array {main_id} ({len(ids)} tasks)" if len(ids) > 1 else f"job {main_id}"
    print(
        f"slurmtf: submitted {kind}: {spec.nodes} node(s) x {spec.tasks_per_node} task(s)", file=out
    )
    for job_id, params in zip(ids, grid, strict=True):
        label = f" {params}" if params else ""
        print(f"slurmtf: {job_id}{label} logs:", file=out)
        for rank, path in enumerate(rank_log_paths(spec.folder, job_id, spec.num_tasks)):
            print(f"  rank {rank}: {path}", file=out)
    out.flush()
    return main_id, ids


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    """Entry point; ``argv`` excludes the program name. Exit 2 on usage errors."""
    args = list(sys.argv[1:] if argv is None else argv)
    fv = flags.FlagValues()  # type: ignore[no-untyped-call]
    define_flags(fv)
    if "--help" in args or "-h" in args:
        print(__doc__, file=out)
        print(fv.get_help(), file=out)
        return 0
    try:
        rest = fv(["slurmtf submit", *underscore_flags(args, set(fv))])[1:]
    except flags.Error as exc:
        print(f"slurmtf submit: {exc}. HINT: see `slurmtf submit --help`", file=sys.stderr)
        return EXIT_USAGE
    try:
        spec = spec_from_flags(fv, rest)
        if fv.dry_run:
            dry_run(spec, sys.executable, out)
            return 0
        if spec.cluster == "local":
            from slurmtf.local import run_local

            return run_local(spec, out)
        main_id, ids = submit_slurm(spec, out)
        if not fv.wait:
            return 0
        status: int = follow(main_id, spec.folder, spec.num_tasks, out=out, log_job=ids[0])
        return status
    except SlurmtfError as exc:
        return report_error("slurmtf submit", exc)


if __name__ == "__main__":
    sys.exit(main())
