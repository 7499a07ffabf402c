"""The entry point every bundled model shares: flags -> layout -> strategy -> loop.

``main_for`` parses absl flags from ``argv`` (without the program name), resolves this
task's place in the Slurm job through :mod:`slurmtf.resolver`, and runs the loop. Usage
errors print one ``NAME='value': problem. HINT: fix`` line on stderr and return 2.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import time
from collections.abc import Callable, MutableMapping, Sequence

from absl import flags

from slurmtf import events
from slurmtf.cli import report_error
from slurmtf.cluster.flags import NO_INDEX, apply_cluster_flags
from slurmtf.contracts import EXIT_FAILURE, EXIT_USAGE
from slurmtf.errors import InputError, SlurmtfError
from slurmtf.runtime.rank import allocator, standby, teardown, temp_folder
from slurmtf.runtime.rank.held_port import check_port
from slurmtf.tf import install
from slurmtf.training import sidecar
from slurmtf.training.flags import TrainConfig, config_from_flags, define_flags
from slurmtf.training.loop import ModelSpec, RunInfo, run
from slurmtf.training.strategy import PEER_FAILURES

FLAGS = flags.FLAGS
flags.DEFINE_bool(
    "placement_only",
    False,
    "Resolve this rank's place and GPUs (CUDA_VISIBLE_DEVICES as applied), print them as "
    "one `placement` event and exit 0 without starting TensorFlow: checks a job's GPU binding.",
)
EXIT_PEER_FAILURE = EXIT_FAILURE
# How TensorFlow names a task in its errors ("remote target /job:worker/replica:0/task:1",
# "unhealthy ... /job:worker/replica:0/task:1", "timed out task names: ...").
_TASK = re.compile(r"/job:worker/(?:replica:\d+/)?task:(\d+)")


def lost_peers(message: str, info: RunInfo) -> str:
    """``rank 1 (node2:12001)`` for every other rank a TensorFlow error names, or ``""``."""
    ranks = sorted({int(n) for n in _TASK.findall(message)} - {info.rank})
    return ", ".join(
        f"rank {r} ({info.workers[r]})" if r < len(info.workers) else f"rank {r}" for r in ranks
    )


def report_lost_peers(message: str, info: RunInfo) -> None:
    """The ``peer_lost`` event: which ranks (and nodes) a TensorFlow peer error names, and
    whether their heartbeats stopped (a frozen node), for the job script's decision."""
    ranks = sorted({int(n) for n in _TASK.findall(message)} - {info.rank})
    nodes = {r: info.workers[r].rsplit(":", 1)[0] for r in ranks if r < len(info.workers)}
    lost = [{"rank": r, **({"node": nodes[r]} if r in nodes else {})} for r in ranks]
    events.emit("peer_lost", rank=info.rank, lost=lost, heartbeat="heartbeat" in message.lower())


def resolve_info(
    program: str = "slurmtf",
    *,
    evaluator: bool = False,
    worker_hosts: str | None = None,
    task_index: int = NO_INDEX,
) -> RunInfo:
    """This task's rank, peers and GPUs, from the resolver (a single worker outside Slurm).

    ``worker_hosts``/``task_index`` (``--worker_hosts``, ``--task_index``): outside Slurm
    the cluster, as TensorFlow's official models take it; inside a Slurm job they must
    agree with Slurm (:func:`slurmtf.cluster.flags.apply_cluster_flags`).
    ``evaluator`` (``--evaluator``): the step's last task is a sidecar evaluator, unless
    ``SLURMTF_JOBS`` already names one. Narrows ``CUDA_VISIBLE_DEVICES`` to this task's
    GPUs (:func:`slurmtf.cluster.gpu_plan.apply_gpu_split`) before TensorFlow starts; raises
    ``InputError`` when two workers would share a GPU.
    """
    from slurmtf.cluster.env import read_slurm_env
    from slurmtf.cluster.gpu_plan import apply_gpu_split
    from slurmtf.resolver import resolve

    layout = apply_cluster_flags(resolve(), worker_hosts, task_index)
    jobs = read_slurm_env().jobs or ""
    if evaluator and not sidecar.has_evaluator(layout.roles):
        if not layout.in_slurm and worker_hosts:
            raise InputError(
                "--evaluator",
                True,
                "needs a Slurm job: --worker_hosts names workers only",
                "leave out --evaluator, or run the job under Slurm",
            )
        if layout.roles is not None:
            raise InputError(
                "--evaluator",
                True,
                f"asks for an evaluator task, but SLURMTF_JOBS={jobs} names none",
                "add evaluator:1 to SLURMTF_JOBS, or leave SLURMTF_JOBS unset",
            )
        jobs = sidecar.evaluator_jobs(layout.num_workers)
        layout = resolve(jobs=jobs)
    sidecar.check_model_roles(layout.roles, jobs)
    plan = apply_gpu_split(layout)
    check_port(layout)  # a held port: a port_in_use event, and the recovery moves on
    return RunInfo(
        layout,
        program=program,
        cuda_visible_devices=plan.value,
        planned_replicas=plan.replicas,
        gpu_plan=plan.message,
    )


def emit_placement(info: RunInfo) -> int:
    """``--placement_only``: this rank's place and GPUs as one event line; no TensorFlow."""
    layout = info.layout
    events.emit(
        "placement",
        rank=info.rank,
        role=layout.task_type,
        num_workers=info.num_workers,
        node=None if layout.is_single_worker else layout.node,
        local_id=0 if layout.is_single_worker else layout.local_id,
        cuda_visible_devices=info.cuda_visible_devices,
        planned_replicas=info.planned_replicas,
        gpu_plan=info.gpu_plan,
    )
    return 0


def main_for(
    program: str,
    argv: Sequence[str] | None,
    make_spec: Callable[[TrainConfig], ModelSpec],
    *,
    default_batch_size: int,
    default_learning_rate: float,
    info: RunInfo | None = None,
) -> int:
    """Parse ``argv``, build the model's spec and train; returns the exit code."""
    allocator.tune()  # before TensorFlow's thread pools start (docs/SOAK.md)
    define_flags()
    args = list(sys.argv[1:] if argv is None else argv)
    if "--help" in args or "-h" in args or "--helpfull" in args:
        _print_help(program)
        return 0
    try:
        FLAGS([program, *args])
    except flags.Error as exc:
        print(f"{program}: {exc}. HINT: python -m {program} --help", file=sys.stderr)
        return EXIT_USAGE
    try:
        if not ready_to_train(os.environ):
            return 0  # a warm rank that was not needed
        install.check_release()
        config = staged(
            config_from_flags(
                default_batch_size=default_batch_size,
                default_learning_rate=default_learning_rate,
            )
        )
        spec = make_spec(config)
        info = (
            dataclasses.replace(info, program=program)
            if info
            else resolve_info(
                program,
                evaluator=config.evaluator,
                worker_hosts=config.worker_hosts,
                task_index=config.task_index,
            )
        )
        if sidecar.has_evaluator(info.layout.roles):
            sidecar.check_sidecar_config(config.stop_threshold, config.eval_only)
        if FLAGS.placement_only:
            return emit_placement(info)
        return run(spec, config, info)
    except SlurmtfError as exc:  # bad input (2), or e.g. this task's port is taken (1)
        return report_error(program, exc)
    except Exception as exc:
        if type(exc).__name__ not in PEER_FAILURES:
            raise
        code = _report_peer_failure(program, exc, info)
        if info is not None and not info.layout.is_single_worker:
            # The survivor has saved the step it held (training.rescue): it ends now, not
            # after the 1-2 s of an interpreter's teardown, so the next attempt starts sooner.
            teardown.leave_alone(code)
        return code
    finally:
        FLAGS.unparse_flags()


def ready_to_train(environ: MutableMapping[str, str]) -> bool:
    """:func:`warm_start`, then this rank's own temporary folder (a killed rank's
    TensorFlow files go with its slot); False for a warm rank that was not needed."""
    if not warm_start(environ):
        return False
    temp_folder.use_own(environ)
    return True


def warm_start(environ: MutableMapping[str, str]) -> bool:
    """A warm rank (:mod:`slurmtf.runtime.rank.standby`) imports TensorFlow and Keras,
    then waits for its supervisor's word: True to train, False to exit. Others: True."""
    if standby.go_file(environ) is None:
        return True
    started = time.monotonic()
    with standby.quiet_stderr(environ):
        install.import_tensorflow()  # and Keras: most of a start after TensorFlow's

        rank = int(environ.get("SLURM_PROCID") or 0)
        events.emit("warm", rank=rank, seconds=round(time.monotonic() - started, 2))
        return standby.start_when_told(environ)


def staged(config: TrainConfig) -> TrainConfig:
    """``--data_dir`` as this node's verified copy when the job staged it (STAGE_DATA)."""
    import os

    from slurmtf.datasets.stage import resolve_data_dir

    data_dir = resolve_data_dir(config.data_dir, os.environ)
    return config if data_dir == config.data_dir else dataclasses.replace(config, data_dir=data_dir)


def _print_help(program: str) -> None:
    print(f"usage: python -m {program} [--flag=value ...]\n")
    # The model's own flags are keyed by how it was started (`-m`: its file path).
    model_keys = [k for k in FLAGS.flags_by_module_dict() if _is_model_key(k, program)]
    for module in [*model_keys, "slurmtf.training.flags", "slurmtf.training.app"]:
        text = FLAGS.module_help(module)
        if text:
            print(text + "\n")
    print("Also absl logging flags: --log_dir (per-rank log files), --verbosity.")


def _report_peer_failure(program: str, exc: Exception, info: RunInfo | None) -> int:
    """One line naming the lost ranks of a TensorFlow peer error; exit status 1."""
    text = str(exc).strip()
    first = text.splitlines()[-1] if text else ""
    lost = lost_peers(text, info) if info is not None else ""
    who = f" - lost {lost}" if lost else ""
    if info is not None:
        report_lost_peers(text, info)
    print(
        f"{program}: a peer failed, stalled or timed out{who} ({type(exc).__name__}): {first}. "
        "HINT: read the other ranks' logs for the first error; rerun (or requeue) to "
        "resume from the last checkpoint; --stall_timeout, --heartbeat_timeout and "
        "--registration_timeout set how long a rank waits",
        file=sys.stderr,
    )
    return EXIT_PEER_FAILURE


def _is_model_key(key: str, program: str) -> bool:
    """Whether an absl module key names the model ``program`` (``models.mnist``)."""
    path = program.replace(".", "/") + ".py"
    return key in (program, "__main__") or key.endswith(path)
