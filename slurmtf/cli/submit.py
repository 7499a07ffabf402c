"""``slurmtf submit`` / ``python -m slurmtf.submit``: a multi-node TensorFlow job in one command.

Examples::

    python -m slurmtf.submit --model=mnist --nodes=2 --time=30 --wait -- --train_steps=200
    python -m slurmtf.submit --dry_run --model=mnist --nodes=2 --gpus_per_node=4 --time=30
    python -m slurmtf.submit --module=mypkg.train --sweep=learning_rate=0.1,0.01 --partition=gpu

Flags after ``--`` go to the model (or module, function, command) unchanged. The job
is rendered and submitted by submitit (one job, or one job array for a sweep); each
task runs :mod:`slurmtf.launch`. Never imports TensorFlow.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from slurmtf.cli import ArgumentParser, add_flag, report_error
from slurmtf.contracts import DEFAULT_LOG_DIR, DEFAULT_PREEMPTION_SIGNAL
from slurmtf.errors import SlurmtfError, UsageError
from slurmtf.monitor.status import follow
from slurmtf.slurm.controller import persist
from slurmtf.slurm.runner import default_runner
from slurmtf.spec import jobspec
from slurmtf.submit import dry_run, spec_from_args, submit_slurm

PROGRAM = "slurmtf submit"


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROGRAM, add_help=False, usage=f"{PROGRAM} [FLAGS] [-- ARGS]")
    _what_runs(parser.add_argument_group("what every task runs (exactly one)"))
    _resources(parser.add_argument_group("resources"))
    _node_failure(parser.add_argument_group("node failure"))
    _job(parser.add_argument_group("the job"))
    mode = parser.add_argument_group("how")
    add_flag(
        mode,
        "cluster",
        choices=jobspec.CLUSTERS,
        default="slurm",
        help="slurm, or local processes (default slurm)",
    )
    add_flag(
        mode,
        "dry_run",
        action="store_true",
        help="print the sbatch script and per-task command; submit nothing",
    )
    add_flag(
        mode,
        "wait",
        action="store_true",
        help="follow rank 0's log until the job ends; exit with its status",
    )
    add_flag(
        mode,
        "verbose",
        action="store_true",
        help="with --wait: all of rank 0's stderr (TensorFlow's info lines too)",
    )
    return parser


def _what_runs(group: argparse._ArgumentGroup) -> None:
    add_flag(group, "model", help=f"bundled model: {', '.join(jobspec.MODELS)}")
    add_flag(group, "module", help="run `python -m MODULE` in every task")
    add_flag(group, "function", help="call MODULE:FUNCTION(argv) -> int in every task")
    add_flag(group, "command", help="run this command (split like a shell, no shell)")
    add_flag(
        group,
        "legacy_keras",
        action="store_true",
        help="TF_USE_LEGACY_KERAS=1 in every task (tf_keras; slurmtf[keras2])",
    )
    add_flag(
        group,
        "cluster_flags",
        action="store_true",
        help="with --command='python SCRIPT' or --module: append each task's "
        "--worker_hosts=H1:P1,... --task_index=N to the script's arguments (as "
        "TensorFlow's official models take the cluster; `slurmtf run --cluster_flags`)",
    )


def _resources(group: argparse._ArgumentGroup) -> None:
    add_flag(
        group,
        "nodes",
        default="1",
        help="nodes: N, or MIN-MAX for as many as Slurm can give in the range at each "
        "(re)start (the global --batch_size is kept) (default 1)",
    )
    add_flag(
        group,
        "gpus_per_node",
        type=int,
        default=0,
        help="GPUs per node; one task per GPU (one task per node without)",
    )
    add_flag(
        group,
        "gpus_per_task",
        type=int,
        default=1,
        help="GPUs of each task (worker): --gpus_per_node/N tasks per node, each "
        "bound to its own GPUs; =--gpus_per_node for one worker per node",
    )
    add_flag(
        group,
        "gpu_flag",
        choices=jobspec.GPU_FLAGS,
        default="gres",
        help="how GPUs are asked for: --gres=gpu:N, --gpus-per-node=N or "
        "--gpus-per-task=K (default gres)",
    )
    add_flag(group, "cpus_per_task", type=int, help="CPUs per task")
    add_flag(
        group,
        "cpus_per_gpu",
        type=int,
        help="CPUs per GPU (sbatch --cpus-per-gpu; default: the site's DefCpuPerGPU, else "
        "one CPU per task)",
    )
    add_flag(group, "mem", help="memory per node, e.g. 16G")
    add_flag(
        group, "time", default="60", help="time limit: minutes, HH:MM:SS or D-HH:MM (default 60)"
    )
    named = {
        "partition": "partition",
        "account": "account",
        "qos": "quality of service",
        "constraint": "node features, e.g. a100",
    }
    for name, text in named.items():
        add_flag(group, name, help=text)
    add_flag(group, "exclusive", action="store_true", help="whole nodes only")
    add_flag(
        group,
        "jobs",
        metavar="ROLES",
        help="a ParameterServerStrategy job: roles of the tasks, e.g. chief:1,ps:2,worker:2 "
        "(all counted: that many tasks over --nodes; a last role without a count takes the "
        "rest). ps and worker tasks run `slurmtf serve`, the chief --command/--module",
    )


def _node_failure(group: argparse._ArgumentGroup) -> None:
    """What a failed node costs: spares to take its place, whether Slurm ends the job."""
    add_flag(
        group,
        "spare_nodes",
        type=int,
        default=0,
        help="allocate --nodes plus this many nodes and train on --nodes; a spare takes a "
        "lost node's place in the same allocation (default 0)",
    )
    add_flag(
        group,
        "kill_on_node_failure",
        action="store_true",
        help="let Slurm end the job when one of its nodes fails (sbatch's default); "
        "without it the job runs with --no-kill and goes on without the node",
    )


def _job(group: argparse._ArgumentGroup) -> None:
    _script_lines(group)
    _sweep(group)
    _data_and_nodes(group)
    _names_and_logs(group)
    _restarts(group)


def _script_lines(group: argparse._ArgumentGroup) -> None:
    """What the job script adds: shell lines, sbatch options."""
    repeat = {"action": "append", "default": []}
    add_flag(
        group,
        "setup",
        **repeat,
        help="a shell line run before the tasks, e.g. 'module load cuda' (repeatable)",
    )
    add_flag(
        group,
        "sbatch_extra",
        **repeat,
        help="another sbatch option as KEY=VALUE, e.g. mail-type=END (repeatable)",
    )


def _sweep_hparams(job_id: str) -> None:
    """A sweep's HParams data for TensorBoard, at its submission (each point's
    parameters) and at the end of ``--wait`` (its results); ``slurmtf sweep`` and
    ``slurmtf tensorboard`` bring it up to date. Best effort: the job's status is what
    submit returns."""
    from slurmtf.monitor.hparams import write_rows
    from slurmtf.monitor.sweeps import collect

    try:
        write_rows(job_id, collect(job_id, default_runner) or [])
    except SlurmtfError:
        return


def _sweep(group: argparse._ArgumentGroup) -> None:
    """One array task per point of a grid or a random search."""
    add_flag(
        group,
        "sweep",
        action="append",
        default=[],
        help="NAME=V1,V2,...: one array task per grid point; NAME=log:LOW:HIGH, "
        "uniform:LOW:HIGH or int:LOW:HIGH: a range for --samples (repeatable)",
    )
    add_flag(
        group,
        "samples",
        type=int,
        default=0,
        help="random search: this many points, each --sweep name drawn on its own "
        "(ranges sampled, lists chosen from) (default 0: the grid)",
    )
    add_flag(
        group,
        "seed",
        type=int,
        default=0,
        help="random search seed: the same seed gives the same points (default 0)",
    )
    add_flag(
        group,
        "array_parallelism",
        type=int,
        default=256,
        help="array tasks running at once (default 256)",
    )


def _data_and_nodes(group: argparse._ArgumentGroup) -> None:
    """Before training: the data staged to each node, the nodes checked."""
    add_flag(
        group,
        "stage_data",
        action="store_true",
        help="copy the model's --data_dir once per node to local scratch ($SLURM_TMPDIR, "
        "$TMPDIR or STAGE_DIR), verify it against its MANIFEST.json, train from the copy",
    )
    add_flag(
        group,
        "check_first",
        action="store_true",
        help="run `slurmtf check` on the job's nodes first; an outlier node: requeue the job "
        "without it (one restart of --max_restarts), or stop when none is left (docs/CHECK.md)",
    )
    add_flag(
        group,
        "container_prefix",
        default="",
        help="start every rank's command behind this prefix, e.g. 'apptainer exec --nv tf.sif' "
        "(slurmtf's own steps run without it; docs/FAILURES.md, Containers)",
    )
    add_flag(
        group,
        "container_python",
        default="",
        help="the ranks' interpreter inside the container (default python3: the image's own, "
        "with its TensorFlow; never the submitting interpreter's path)",
    )


def _names_and_logs(group: argparse._ArgumentGroup) -> None:
    add_flag(group, "job_name", default="slurmtf", help="job name (default slurmtf)")
    add_flag(
        group,
        "log_dir",
        default=DEFAULT_LOG_DIR,
        help="folder (shared by the nodes) for per-rank logs and job files "
        f"(default {DEFAULT_LOG_DIR})",
    )


def _restarts(group: argparse._ArgumentGroup) -> None:
    """The preemption signal and how often the job is requeued."""
    add_flag(
        group,
        "signal",
        default=DEFAULT_PREEMPTION_SIGNAL,
        help="signal sent before the time limit (NCCL reserves USR1)",
    )
    add_flag(
        group,
        "signal_delay_s",
        type=int,
        default=None,
        help="seconds before the time limit the signal arrives (default "
        f"{jobspec.DEFAULT_SIGNAL_DELAY_S}, or a quarter of a --time under 8 minutes)",
    )
    add_flag(
        group,
        "max_restarts",
        type=int,
        default=3,
        help="restart the job at most this often, restarts in place and requeues "
        "together: a killed rank, a lost peer or a stall start a new step in the same "
        "allocation (also with --cluster=local); a preemption (exit 75) requeues; a "
        "failed node is left out. Bad flags and model errors are not retried (default 3)",
    )
    add_flag(group, "max_requeues", type=int, help="former name of --max_restarts")
    add_flag(
        group,
        "restart_budget",
        default="progress",
        help="what --max_restarts counts: 'progress' (failures in a row after which training "
        "did not advance; a failure after a new highest step starts the count again) or "
        "'total' (every restart and requeue of the job) [RESTART_BUDGET, progress]",
    )
    add_flag(
        group,
        "max_failures_per_hour",
        type=int,
        default=0,
        help="stop a job that failed more often than this within the last hour, however far "
        "it got (0: no limit) [MAX_FAILURES_PER_HOUR, 0]",
    )


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    """Entry point; ``argv`` excludes the program name. Exit 2 on usage errors."""
    args = list(sys.argv[1:] if argv is None else argv)
    cut = args.index("--") if "--" in args else len(args)
    ours, rest = args[:cut], args[cut + 1 :]
    parser = _parser()
    if "--help" in ours or "-h" in ours:
        print(__doc__, file=out)
        print(parser.format_help(), file=out)
        return 0
    try:
        options = parser.parse_args(ours)
        spec = spec_from_args(options, rest)
        if options.dry_run:
            dry_run(spec, sys.executable, out)
            return 0
        if spec.cluster == "local":
            from slurmtf.local.job import run_local

            return run_local(spec, out)
        # sbatch needs the controller: a brief retry while it cannot be reached
        main_id, ids = persist(
            lambda: submit_slurm(spec, out),
            ["sbatch"],
            asked=f"sbatch of job {spec.job_name!r} ({spec.node_count} node(s), via submitit)",
        )
        if len(ids) > 1:
            _sweep_hparams(main_id)  # every point's parameters, before any has run
        if not options.wait:
            return 0
        status: int = follow(
            main_id, spec.folder, spec.most_tasks, out=out, log_job=ids[0], verbose=options.verbose
        )
        if len(ids) > 1:
            _sweep_hparams(main_id)
        return status
    except (SlurmtfError, UsageError) as exc:
        return report_error(PROGRAM, exc)
