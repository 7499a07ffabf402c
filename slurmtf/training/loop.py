"""The distributed custom training loop shared by the bundled models.

Keras 3 ``model.fit`` fails under ``MultiWorkerMirroredStrategy`` in TF 2.21, so the
models train with Keras layers driven by ``strategy.run`` and
``tf.nn.compute_average_loss`` on the GLOBAL batch. Each worker reads its own shard
(``distribute_datasets_from_function``) batched per replica.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from absl import logging

from slurmtf import events
from slurmtf.cluster.layout import ClusterLayout
from slurmtf.contracts import EXIT_PREEMPTED
from slurmtf.runtime import teardown
from slurmtf.training import (
    checkpoints,
    grad_reduce,
    progress_watch,
    reporting,
    sidecar,
    steptiming,
)
from slurmtf.training.checkpoints import Checkpointer
from slurmtf.training.export import Summaries, export_saved_model
from slurmtf.training.flags import (
    TrainConfig,
    check_batch_size,
    fit_default_batch,
    scaled_learning_rate,
)
from slurmtf.training.grad_reduce import GradReduce
from slurmtf.training.preemption import PreemptionWatcher
from slurmtf.training.strategy import describe, make_strategy, plan_strategy, split_cpu

# (input_context, per_replica_batch, skip_batches=0) -> dataset of (images, labels),
# batched per replica and repeated; skip_batches positions it after a resume.
DatasetFn = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What a model tells the loop; everything else comes from :class:`TrainConfig`."""

    name: str
    build_model: Callable[[], Any]
    input_shape: tuple[int, ...]
    train_dataset: DatasetFn
    eval_dataset: DatasetFn
    num_train_examples: int
    num_eval_examples: int
    reference_batch: int
    make_optimizer: Callable[[Any], Any]  # learning-rate schedule -> Keras optimizer
    decay_epochs: tuple[int, ...] = ()
    decay_factor: float = 0.1
    warmup_epochs: int = 0  # used when --warmup_steps is not given
    # Non-trainable state each replica updates on its own (per-replica batch-norm
    # statistics): averaged over all replicas before every evaluation and checkpoint, so
    # every rank evaluates, saves and ends with the same weights.
    replica_local_state: bool = False
    # The spec reads its own data (slurmtf.train users): --data_dir and the synthetic-data
    # warning do not apply.
    own_data: bool = False


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """This process in the job: its place (the layout) and the GPUs it runs with."""

    layout: ClusterLayout
    program: str = "slurmtf"  # prefix of the one-line errors (e.g. models.mnist)
    cuda_visible_devices: str | None = None  # as applied by slurmtf.cluster.gpu_plan (None: unset)
    planned_replicas: int = 1  # GPUs this worker keeps (1 without GPUs)
    gpu_plan: str = ""  # why: slurmtf.cluster.gpu_plan.GpuPlan.message

    @property
    def rank(self) -> int:
        return self.layout.task_index

    @property
    def num_workers(self) -> int:
        return self.layout.num_workers

    @property
    def is_chief(self) -> bool:
        return self.layout.is_chief

    @property
    def workers(self) -> tuple[str, ...]:
        return tuple(self.layout.workers)

    @property
    def restart_count(self) -> int:
        return self.layout.restart_count


def run(spec: ModelSpec, config: TrainConfig, info: RunInfo) -> int:
    """Train (or evaluate) ``spec`` as ``config`` says; returns the process exit code.

    An evaluator task (``SLURMTF_JOBS=...,evaluator:1``) evaluates the workers'
    checkpoints instead (:mod:`slurmtf.training.sidecar`); it joins no collective.
    """
    if info.layout.task_type == sidecar.EVALUATOR:
        return sidecar.run_evaluator(spec, config, info)
    watcher = PreemptionWatcher(config.preemption_signal).install()
    watch = progress_watch.from_config(
        config, info.rank, info.workers, _log_dir(config), info.program
    )
    try:
        code = _run(spec, config, info, watcher, watch or _NO_WATCH)
    finally:
        watcher.uninstall()
        if watch is not None:
            watch.stop()
    # Done or preempted after saving: every rank ends here, workers first, the leader
    # last (a multi-worker process exits inside this call; see slurmtf.runtime.teardown).
    teardown.leave_together(exit_code=code)
    return code


def _log_dir(config: TrainConfig) -> str | None:
    """Per-rank logs and progress records: ``--log_dir``, else ``<model_dir>/logs``."""
    return config.log_dir or (f"{config.model_dir}/logs" if config.model_dir else None)


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


_NO_WATCH = _NoWatch()


def _run(
    spec: ModelSpec,
    config: TrainConfig,
    info: RunInfo,
    watcher: PreemptionWatcher,
    watch: Any,
) -> int:
    """The phases of :func:`run`; the preemption handler is installed from the start."""
    num_gpus, log_path = _set_up_process(config, info)
    teardown.prepare()
    workers_before = _workers_before(config, info)  # before the chief records this start
    choice, strategy = _start_strategy(config, info, num_gpus)
    watcher.install()  # again: the runtime may have taken the signal (TF does for SIGTERM)
    watch.start()  # peers have joined; model building and the first step get a grace
    config, per_replica = _fit_batch(
        config, int(strategy.num_replicas_in_sync), max(_training_tasks(info), 1)
    )
    _announce(
        spec, config, info, strategy=strategy, choice=choice, num_gpus=num_gpus,
        per_replica=per_replica, log_path=log_path, workers_before=workers_before,
    )  # fmt: skip
    plan = _Plan.of(spec, config)
    training = _Training.build(
        spec, config, info, strategy=strategy, plan=plan, per_replica=per_replica,
        watcher=watcher, watch=watch,
    )  # fmt: skip
    if config.eval_only:
        if training.restored is None:
            logging.warning("--eval_only without a checkpoint: evaluating initial weights")
        training.evaluate(training.start)
        training.done(_Outcome(training.start))
        return 0
    outcome = training.train()
    return training.finish(outcome)


def _set_up_process(config: TrainConfig, info: RunInfo) -> tuple[int, str | None]:
    """Threads, per-rank logging; returns the GPUs TensorFlow sees and the log file."""
    import tensorflow as tf

    if config.num_threads:
        tf.config.threading.set_intra_op_parallelism_threads(config.num_threads)
        tf.config.threading.set_inter_op_parallelism_threads(config.num_threads)
    log_path = reporting.setup_logging(
        info.rank, info.is_chief, _log_dir(config), config.log_all_ranks
    )
    return len(tf.config.list_physical_devices("GPU")), log_path


def _start_strategy(config: TrainConfig, info: RunInfo, num_gpus: int) -> tuple[Any, Any]:
    """The strategy plan and the strategy (joins the peers of a multi-worker job)."""
    mode = config.distribution_strategy
    if config.cpu_replicas > 1:
        mode = split_cpu(config.cpu_replicas, mode, info.num_workers, num_gpus)
    choice = plan_strategy(mode, config.all_reduce_alg, info.num_workers, num_gpus)
    strategy = make_strategy(
        choice,
        None if info.layout.is_single_worker else info.layout,
        collective_timeout=config.collective_timeout,
        heartbeat_timeout=config.heartbeat_timeout,
        registration_timeout=config.registration_timeout,
    )
    return choice, strategy


def _fit_batch(config: TrainConfig, replicas: int, workers: int) -> tuple[TrainConfig, int]:
    """The config with a global batch that splits over ``replicas``; the per-replica batch.

    Also sets Keras's precision policy and seed (before the model is built).
    """
    import keras

    fitted = fit_default_batch(config, replicas)
    if fitted.batch_size != config.batch_size:
        logging.warning(
            "The default global batch %d does not split over %d replicas: using %d "
            "(--batch_size sets it)",
            config.batch_size,
            replicas,
            fitted.batch_size,
        )
        config = fitted
    per_replica = check_batch_size(config.batch_size, replicas, replicas // workers)
    policy = {"fp32": "float32", "fp16": "mixed_float16", "bf16": "mixed_bfloat16"}[config.dtype]
    keras.mixed_precision.set_dtype_policy(policy)
    keras.utils.set_random_seed(config.seed)
    return config, per_replica


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


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Step counts and the learning-rate schedule's numbers."""

    steps_per_epoch: int
    total: int
    eval_every: int
    eval_steps: int
    learning_rate: float
    warmup: int
    boundaries: list[int]

    @classmethod
    def of(cls, spec: ModelSpec, config: TrainConfig) -> _Plan:
        per_epoch = max(1, spec.num_train_examples // config.batch_size)
        warmup = config.warmup_steps
        return cls(
            steps_per_epoch=per_epoch,
            total=config.train_steps or config.train_epochs * per_epoch,
            eval_every=config.epochs_between_evals * per_epoch,
            eval_steps=config.eval_steps or max(1, spec.num_eval_examples // config.batch_size),
            learning_rate=scaled_learning_rate(
                config.learning_rate, config.batch_size, spec.reference_batch
            ),
            warmup=warmup if warmup is not None else spec.warmup_epochs * per_epoch,
            boundaries=[e * per_epoch for e in spec.decay_epochs],
        )


@dataclasses.dataclass
class _Outcome:
    """Where training stopped: the step, the first and last loss, and why."""

    step: int
    first_loss: float | None = None
    last_loss: float | None = None
    preempted: bool = False


@dataclasses.dataclass
class _Training:
    """Model, optimizer, checkpoints and compiled steps of one run, and its phases."""

    spec: ModelSpec
    config: TrainConfig
    info: RunInfo
    strategy: Any
    plan: _Plan
    per_replica: int
    watcher: PreemptionWatcher
    watch: Any
    model: Any
    schedule: Any
    step_var: Any
    ckpt: Checkpointer
    steps: _Steps
    summaries: Summaries
    sync_state: Callable[[], None]
    restored: Any
    start: int
    timing: steptiming.StepTiming
    eval_iterator: Any = None  # built at the first evaluation
    # False beside an evaluator task: save at the evaluation cadence, evaluate nowhere.
    evaluates: bool = True

    @classmethod
    def build(
        cls,
        spec: ModelSpec,
        config: TrainConfig,
        info: RunInfo,
        *,
        strategy: Any,
        plan: _Plan,
        per_replica: int,
        watcher: PreemptionWatcher,
        watch: Any,
    ) -> _Training:
        """Build the model and optimizer under the strategy, restore the last checkpoint."""
        import keras
        import tensorflow as tf

        with strategy.scope():
            model = spec.build_model()
            model(tf.zeros((1, *spec.input_shape)), training=False)
            schedule = make_schedule(
                plan.learning_rate, plan.warmup, plan.boundaries, spec.decay_factor
            )
            optimizer = spec.make_optimizer(schedule)
            if config.dtype == "fp16":
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            optimizer.build(model.trainable_variables)
            step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        ckpt = Checkpointer(
            config.model_dir,
            info.is_chief,
            {"model": model, "optimizer": optimizer, "step": step_var},
            config.keep_checkpoints,
        )
        restored = ckpt.restore_latest()
        start = int(step_var.numpy())
        reduce = GradReduce(config.allreduce_dtype, config.bytes_per_pack)
        replicas = int(strategy.num_replicas_in_sync)
        timing = steptiming.from_layout(
            info.layout, replicas, config.timing_every, config.straggler_window
        )
        steps = _Steps(
            strategy, model, optimizer, config.batch_size, config.enable_xla, reduce=reduce,
            link_columns=len(timing.link_nodes),
        )  # fmt: skip
        sync_state = steps.state_sync() if spec.replica_local_state else _nothing
        steps.check_same_step(start)
        evaluates = not sidecar.has_evaluator(info.layout.roles)
        splits = ("train", "eval") if evaluates else ("train",)
        summaries = Summaries(config.model_dir, info.is_chief, splits)
        return cls(
            spec, config, info, strategy, plan, per_replica, watcher, watch,
            model, schedule, step_var, ckpt, steps, summaries, sync_state, restored, start,
            timing,
            evaluates=evaluates,
        )  # fmt: skip

    def evaluate(self, step: int) -> dict[str, float]:
        """Evaluate on ``plan.eval_steps`` batches; the chief reports it."""
        self.sync_state()
        iterator = self._eval_iterator()
        totals = [0.0, 0.0, 0.0]
        for _ in range(self.plan.eval_steps):
            self.watch.enter("eval", step)
            out = self.steps.eval_step(iterator).numpy()
            self.watch.finished(step, is_train_step=False)
            totals = [a + float(b) for a, b in zip(totals, out, strict=True)]
        count = max(totals[2], 1)
        result = {"loss": totals[0] / count, "accuracy": totals[1] / count}
        if self.info.is_chief:
            epoch = step / self.plan.steps_per_epoch
            events.emit("eval", step=step, epoch=epoch, examples=int(totals[2]), **result)
        self.summaries.scalars("eval", step, result)
        logging.info(
            "eval at step %d: loss %.4f accuracy %.4f%s",
            step,
            result["loss"],
            result["accuracy"],
            " (SYNTHETIC data)" if self.config.synthetic else "",
        )
        return result

    def _eval_iterator(self) -> Any:
        """One iterator for every evaluation, built at the first (docs/SOAK.md: a new
        pipeline per evaluation churned the heap). Each pipeline is cut to the batches
        one evaluation takes and repeated, so every evaluation sees the same batches a
        fresh iterator would."""
        if self.eval_iterator is None:
            spec, per_replica, eval_steps = self.spec, self.per_replica, self.plan.eval_steps

            def pipeline(ctx: Any) -> Any:
                batches = eval_steps * (ctx.num_replicas_in_sync // ctx.num_input_pipelines)
                return spec.eval_dataset(ctx, per_replica).take(batches).repeat()

            self.eval_iterator = iter(self.strategy.distribute_datasets_from_function(pipeline))
        return self.eval_iterator

    def train(self) -> _Outcome:
        """Train from ``start`` to ``plan.total`` (or the preemption signal, or the
        ``--stop_threshold``), evaluating and saving on the way."""
        import tensorflow as tf

        config, total, start = self.config, self.plan.total, self.start
        iterator = self._train_iterator()
        progress = reporting.Progress(total, config.batch_size, config.log_every, start)
        outcome = _Outcome(start)
        t_start = time.monotonic()
        while outcome.step < total:
            self.watch.enter("step", outcome.step)
            flag = tf.constant(1.0 if self.watcher.requested else 0.0)
            extra = tf.constant(self.timing.extra_input())
            out = self.steps.train_step(iterator, flag, extra).numpy()
            outcome.step += 1
            step = outcome.step
            self.watch.finished(step)
            self.timing.add(out[3:], step)
            outcome.last_loss = float(out[0])
            if outcome.first_loss is None:
                outcome.first_loss = outcome.last_loss
            progress.update(outcome.last_loss, float(out[1]))
            if progress.due(step):
                self._report(progress, step)
            if out[2] > 0:
                outcome.preempted = True
                break
            if self._evaluate_and_save(step):
                break
        logging.info("%d steps in %.1f s", outcome.step - start, time.monotonic() - t_start)
        return outcome

    def _train_iterator(self) -> Any:
        spec, per_replica, start = self.spec, self.per_replica, self.start
        return iter(
            self.strategy.distribute_datasets_from_function(
                lambda ctx: spec.train_dataset(
                    ctx,
                    per_replica,
                    # each step takes one batch per replica this pipeline feeds
                    skip_batches=start * (ctx.num_replicas_in_sync // ctx.num_input_pipelines),
                )
            )
        )

    def _report(self, progress: reporting.Progress, step: int) -> None:
        """Progress on the chief (other ranks: to their log file only), summaries."""
        values = progress.report(step)
        if self.info.is_chief:
            events.emit("progress", step=step, total=self.plan.total, **values)
        lr = float(self.schedule(step))
        self.summaries.scalars("train", step, {**values, "learning_rate": lr})

    def _evaluate_and_save(self, step: int) -> bool:
        """Evaluate and save when due; True when ``--stop_threshold`` is reached."""
        config, plan = self.config, self.plan
        save = step == plan.total or bool(
            config.checkpoint_every and step % config.checkpoint_every == 0
        )
        if step % plan.eval_every == 0 or step == plan.total:
            save = True  # beside an evaluator task, it evaluates this checkpoint
            result = self.evaluate(step) if self.evaluates else None
            threshold = config.stop_threshold
            if result is not None and threshold is not None and result["accuracy"] >= threshold:
                logging.info("Reached --stop_threshold=%s; stopping", threshold)
                self.save(step)
                return True
        if save:
            self.save(step)
        return False

    def save(self, step: int) -> None:
        """Save a checkpoint at ``step`` (the chief writes); the watchdog sees the save."""
        self.sync_state()
        self.watch.enter("save", step)
        self.step_var.assign(step)
        self.ckpt.save(step)
        self.watch.finished(step, is_train_step=False)

    def finish(self, outcome: _Outcome) -> int:
        """Save when preempted, export on the chief, the ``done`` event; the exit code."""
        if outcome.preempted:
            self.save(outcome.step)
            logging.warning(
                "Preempted at step %d: checkpoint saved, exiting %d", outcome.step, EXIT_PREEMPTED
            )
        elif self.config.export_dir and self.info.is_chief:
            with self.watch.paused():
                export_saved_model(
                    self.config.export_dir, self.spec.build_model, self.model, self.spec.input_shape
                )
        self.done(outcome)
        return EXIT_PREEMPTED if outcome.preempted else 0

    def done(self, outcome: _Outcome) -> None:
        """The ``done`` event every rank prints (weights checksum included)."""
        events.emit(
            "done",
            rank=self.info.rank,
            step=outcome.step,
            start_step=self.start,
            first_loss=outcome.first_loss,
            last_loss=outcome.last_loss,
            weights_checksum=weights_checksum(self.model),
            restart_count=self.info.restart_count,
            preempted=outcome.preempted,
        )


def weights_checksum(model: Any) -> float:
    """Sum of all weights in float64: equal models give equal sums."""
    import numpy as np

    return float(sum(np.asarray(w, dtype=np.float64).sum() for w in model.get_weights()))


class _Steps:
    """The compiled train and eval steps for one strategy, model and optimizer."""

    def __init__(
        self,
        strategy: Any,
        model: Any,
        optimizer: Any,
        global_batch: int,
        xla: bool,
        *,
        reduce: GradReduce | None = None,
        link_columns: int = 0,
    ) -> None:
        """``link_columns``: the link rates each step carries (slurmtf.training.steptiming)."""
        import tensorflow as tf

        reduce = reduce or GradReduce()
        grad_reduce.take_over_reduction(optimizer, reduce)
        self._strategy = strategy
        self._model = model
        forward_backward = _forward_backward(model, optimizer, global_batch)
        compiled = tf.function(forward_backward, jit_compile=True) if xla else forward_backward
        eval_replica = _eval_replica(model)

        replicas = int(strategy.num_replicas_in_sync)

        def train_replica(images: Any, labels: Any, flag: Any, started: Any, extra: Any) -> Any:
            loss, correct, grads = compiled(images, labels)
            with tf.control_dependencies([loss, *_tensors(grads)]):
                computed = tf.timestamp()
            if reduce.explicit:  # compressed or packed: sum here, not inside Keras
                grads = grad_reduce.all_reduce(grads, reduce)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            # steptiming: this replica's row, [compute, its last step's time, link rates]
            row = tf.concat([tf.cast([computed - started], tf.float32), extra], 0)
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            rows = tf.one_hot(replica, replicas)[:, None] * row[None, :]
            head = tf.stack([loss, correct / global_batch, flag])
            return tf.concat([head, tf.reshape(rows, [-1])], 0)

        def train_step(iterator: Any, flag: Any, extra: Any) -> Any:
            started = tf.timestamp()
            with tf.control_dependencies([started]):
                images, labels = next(iterator)
            out = strategy.run(train_replica, args=(images, labels, flag, started, extra))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, out, axis=None)

        compiled_step = tf.function(train_step)
        no_extra = tf.zeros([1 + link_columns])

        def train(iterator: Any, flag: Any, extra: Any = None) -> Any:
            """``[loss, accuracy, flag, rows...]`` summed over replicas; ``extra``: this
            rank's last step time and link rates (slurmtf.training.steptiming)."""
            return compiled_step(iterator, flag, no_extra if extra is None else extra)

        def eval_step(iterator: Any) -> Any:
            images, labels = next(iterator)
            out = strategy.run(eval_replica, args=(images, labels))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, out, axis=None)

        self.train_step = train
        self.eval_step = tf.function(eval_step)

    def state_sync(self) -> Callable[[], None]:
        """A function that averages the model's float non-trainable variables over replicas.

        One all-reduce of the moving statistics, run at evaluations and checkpoints only.
        """
        import numpy as np
        import tensorflow as tf

        strategy = self._strategy
        state = [v for v in self._model.non_trainable_variables if "float" in str(v.dtype)]
        if not state or strategy.num_replicas_in_sync == 1:
            return _nothing

        sizes = [int(np.prod(v.shape)) for v in state]

        def replica_values() -> Any:
            return tf.concat([tf.reshape(tf.cast(v.value, tf.float32), [-1]) for v in state], 0)

        def sync() -> None:
            flat = strategy.reduce(
                tf.distribute.ReduceOp.MEAN, strategy.run(replica_values), axis=None
            )
            for variable, mean in zip(state, tf.split(flat, sizes), strict=True):
                variable.assign(tf.cast(tf.reshape(mean, variable.shape), variable.dtype))

        compiled = tf.function(sync)

        def run() -> None:
            compiled()

        return run

    def check_same_step(self, step: int) -> None:
        """Fail clearly when ranks resumed from different checkpoints (unshared --model_dir)."""
        import tensorflow as tf

        value = tf.constant([float(step), float(step) ** 2, 1.0], dtype=tf.float64)
        strategy = self._strategy

        def total() -> Any:
            per_replica = strategy.run(lambda: tf.identity(value))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        out = tf.function(total)().numpy()
        mean = out[0] / out[2]
        if abs(out[1] / out[2] - mean * mean) > 1e-6:
            from slurmtf.errors import InputError

            raise InputError(
                "--model_dir",
                "(per rank)",
                f"ranks resumed at different steps (this one at {step})",
                "put --model_dir on a file system every node shares",
            )


def _forward_backward(model: Any, optimizer: Any, global_batch: int) -> Callable[..., Any]:
    """One replica's loss (averaged over the GLOBAL batch), correct count and gradients."""
    import keras
    import tensorflow as tf

    def forward_backward(images: Any, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            logits = tf.cast(model(images, training=True), tf.float32)
            per_example = keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True
            )
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            if model.losses:
                reg = tf.add_n([tf.cast(x, tf.float32) for x in model.losses])
                loss += tf.nn.scale_regularization_loss(reg)
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        return loss, _correct(labels, logits), grads

    return forward_backward


def _eval_replica(model: Any) -> Callable[..., Any]:
    """One replica's summed loss, correct count and example count on a batch."""
    import keras
    import tensorflow as tf

    def eval_replica(images: Any, labels: Any) -> Any:
        logits = tf.cast(model(images, training=False), tf.float32)
        per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        count = tf.cast(tf.shape(labels)[0], tf.float32)
        return tf.stack([tf.reduce_sum(per_example), _correct(labels, logits), count])

    return eval_replica


def _tensors(values: Any) -> list[Any]:
    """The tensors of a gradient list (``None`` left out, ``IndexedSlices`` by values)."""
    return [getattr(v, "values", v) for v in values if v is not None]


def _nothing() -> None:
    """No replica-local state to average."""


def _correct(labels: Any, logits: Any) -> Any:
    import tensorflow as tf

    predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
    return tf.reduce_sum(tf.cast(tf.equal(predictions, tf.cast(labels, tf.int32)), tf.float32))


def make_schedule(peak: float, warmup: int, boundaries: list[int], factor: float) -> Any:
    """Linear warm-up to ``peak``, then ``peak * factor**k`` after the k-th boundary."""
    import keras
    import tensorflow as tf

    class _Schedule(keras.optimizers.schedules.LearningRateSchedule):  # type: ignore[misc]
        def __call__(self, step: Any) -> Any:
            step = tf.cast(step, tf.float32)
            lr = tf.constant(peak, tf.float32)
            for b in boundaries:
                lr = tf.where(step >= b, lr * factor, lr)
            if warmup:
                lr = lr * tf.minimum(1.0, (step + 1.0) / float(warmup))
            return lr

        def get_config(self) -> dict[str, Any]:
            return {"peak": peak, "warmup": warmup, "boundaries": boundaries, "factor": factor}

    return _Schedule()
