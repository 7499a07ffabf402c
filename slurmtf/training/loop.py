"""The distributed custom training loop shared by the bundled models.

Keras 3 ``model.fit`` fails under ``MultiWorkerMirroredStrategy`` in TF 2.21, so the
models train with Keras layers driven by ``strategy.run`` and
``tf.nn.compute_average_loss`` on the GLOBAL batch. Each worker reads its own shard
(``distribute_datasets_from_function``) batched per replica.

This module is the story of a run: set up the process (:mod:`.process`), join the
peers, fit the batch, announce, plan (:mod:`.plan`), then the phases of
:class:`~slurmtf.training.phases.Training` (build, train, evaluate, save, finish) with
the compiled steps of :mod:`.steps`.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from absl import logging

from slurmtf import events
from slurmtf.runtime.rank import teardown
from slurmtf.runtime.rank.held_port import recheck_port
from slurmtf.tf import collectives
from slurmtf.training import checkpoints, sidecar, watchdog
from slurmtf.training.flags import TrainConfig
from slurmtf.training.model_spec import ModelSpec, RunInfo
from slurmtf.training.phases import Outcome, Training, weights_checksum
from slurmtf.training.plan import Plan
from slurmtf.training.preemption import PreemptionWatcher
from slurmtf.training.process import fit_batch, log_dir, set_up_process
from slurmtf.training.strategy import (
    PEER_FAILURES,
    describe,
    make_strategy,
    plan_strategy,
    split_cpu,
)

__all__ = ["ModelSpec", "RunInfo", "run", "weights_checksum"]


def run(spec: ModelSpec, config: TrainConfig, info: RunInfo) -> int:
    """Train (or evaluate) ``spec`` as ``config`` says; returns the process exit code.

    An evaluator task (``SLURMTF_JOBS=...,evaluator:1``) evaluates the workers'
    checkpoints instead (:mod:`slurmtf.training.sidecar`); it joins no collective.
    """
    if info.layout.task_type == sidecar.EVALUATOR:
        return sidecar.run_evaluator(spec, config, info)
    # SIGTERM ends the step: the collectives in flight fail now, the rank saves from memory
    ending = functools.partial(collectives.abort_collectives, "this rank's step was ended")
    watcher = PreemptionWatcher(config.preemption_signal, on_term=ending).install()
    watch = watchdog.from_config(config, info.rank, info.workers, log_dir(config), info.program)
    try:
        code = _run(spec, config, info, watcher, watch or _NO_WATCH)
    finally:
        watcher.uninstall()
        if watch is not None:
            watch.stop()
    # Done or preempted after saving: every rank ends here, workers first, the leader
    # last (a multi-worker process exits inside this call; see slurmtf.runtime.rank.teardown).
    teardown.leave_together(exit_code=code)
    return code


class _NoWatch:
    """Stands in for the watchdog with ``--stall_timeout=0``."""

    def start(self) -> _NoWatch:
        return self

    def enter(self, phase: str, step: int) -> None:
        del phase, step

    def finished(self, step: int, *, is_train_step: bool = True) -> None:
        del step, is_train_step

    def paused(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def at_stall(self, action: Any) -> None:
        del action


_NO_WATCH = _NoWatch()


def _run(
    spec: ModelSpec,
    config: TrainConfig,
    info: RunInfo,
    watcher: PreemptionWatcher,
    watch: Any,
) -> int:
    """The phases of :func:`run`; the preemption handler is installed from the start."""
    num_gpus, log_path = set_up_process(config, info)
    teardown.prepare()
    workers_before = _workers_before(config, info)  # before the chief records this start
    choice, strategy = _start_strategy(config, info, num_gpus)
    watcher.install()  # again: the runtime may have taken the signal (TF does for SIGTERM)
    watch.start()  # peers have joined; model building and the first step get a grace
    config, per_replica = fit_batch(
        config, int(strategy.num_replicas_in_sync), max(_training_tasks(info), 1)
    )
    _announce(
        spec, config, info, strategy=strategy, choice=choice, num_gpus=num_gpus,
        per_replica=per_replica, log_path=log_path, workers_before=workers_before,
    )  # fmt: skip
    plan = Plan.of(spec, config)
    training = Training.build(
        spec, config, info, strategy=strategy, plan=plan, per_replica=per_replica,
        watcher=watcher, watch=watch,
    )  # fmt: skip
    if config.eval_only:
        if training.restored is None:
            logging.warning("--eval_only without a checkpoint: evaluating initial weights")
        training.evaluate(training.start)
        training.done(Outcome(training.start))
        return 0
    outcome = training.train()
    return training.finish(outcome)


def _start_strategy(config: TrainConfig, info: RunInfo, num_gpus: int) -> tuple[Any, Any]:
    """The strategy plan and the strategy (joins the peers of a multi-worker job)."""
    mode = config.distribution_strategy
    if config.cpu_replicas > 1:
        mode = split_cpu(config.cpu_replicas, mode, info.num_workers, num_gpus)
    choice = plan_strategy(mode, config.all_reduce_alg, info.num_workers, num_gpus)
    try:
        strategy = make_strategy(
            choice,
            None if info.layout.is_single_worker else info.layout,
            collective_timeout=config.collective_timeout,
            heartbeat_timeout=config.heartbeat_timeout,
            registration_timeout=config.registration_timeout,
            program=info.program,
        )
    except Exception as exc:
        if type(exc).__name__ not in PEER_FAILURES:  # a peer's failure is no port of ours
            recheck_port(info.layout)  # taken while TensorFlow loaded: the node's, not ours
        raise
    return choice, strategy


def _announce(
    spec: ModelSpec,
    config: TrainConfig,
    info: RunInfo,
    *,
    strategy: Any,
    choice: Any,
    num_gpus: int,
    per_replica: int,
    log_path: str | None,
    workers_before: int | None = None,
) -> None:
    """The ``cluster`` event: where this rank runs and how it will train;
    ``workers_changed_from`` is the previous start's worker count when it differs."""
    replicas = int(strategy.num_replicas_in_sync)
    synthetic = config.synthetic and not spec.own_data
    events.emit(
        "cluster",
        rank=info.rank,
        num_workers=info.num_workers,
        workers=list(info.workers),
        role=info.layout.task_type,
        strategy=describe(strategy),
        collective=choice.collective,
        replicas=replicas,
        gpus=num_gpus,
        cuda_visible_devices=info.cuda_visible_devices,
        local_replicas=replicas // max(_training_tasks(info), 1),
        planned_replicas=info.planned_replicas,
        gpu_plan=info.gpu_plan,
        global_batch=config.batch_size,
        per_replica_batch=per_replica,
        dtype=config.dtype,
        synthetic=synthetic,
        data_dir=None if synthetic else config.data_dir,  # the path read (a staged copy)
        restart_count=info.restart_count,
        port_rule=info.layout.port_rule,  # how this attempt's ports follow from the job
        workers_changed_from=workers_before,
        log_file=log_path,
    )
    if info.is_chief:
        checkpoints.record_workers(config.model_dir, _training_tasks(info))
    if synthetic:
        logging.warning(
            "Training on SYNTHETIC data (%s)", "asked" if config.data_dir else "no --data_dir"
        )


def _workers_before(config: TrainConfig, info: RunInfo) -> int | None:
    """The worker count of the previous start when it differs (a ``--nodes`` range)."""
    before = checkpoints.previous_workers(config.model_dir)
    return before if before is not None and before != _training_tasks(info) else None


def _training_tasks(info: RunInfo) -> int:
    """The tasks that train (all but a sidecar evaluator)."""
    roles = info.layout.roles
    return info.num_workers if roles is None else sidecar.training_tasks(roles)
