"""The phases of one training run: build the model and restore (:meth:`Training.build`),
train (:meth:`Training.train`), evaluate, save, and finish with the ``done`` event."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

from absl import logging

from slurmtf import events
from slurmtf.contracts import EXIT_PREEMPTED
from slurmtf.tf import collectives, compat
from slurmtf.training import allocation, reporting, sidecar, steptiming
from slurmtf.training.checkpoints import Checkpointer
from slurmtf.training.export import Summaries, export_saved_model
from slurmtf.training.flags import TrainConfig
from slurmtf.training.grad_reduce import GradReduce
from slurmtf.training.model_spec import ModelSpec, RunInfo
from slurmtf.training.plan import Plan, make_schedule
from slurmtf.training.preemption import PreemptionWatcher
from slurmtf.training.process import log_dir
from slurmtf.training.steps import Steps, no_state_sync
from slurmtf.training.strategy import PEER_FAILURES
from slurmtf.training.trackers import EXIT_WAIT_S, Trackers


@dataclasses.dataclass
class Outcome:
    """Where training stopped: the step, the first and last loss, and why."""

    step: int
    first_loss: float | None = None
    last_loss: float | None = None
    preempted: bool = False


@dataclasses.dataclass
class Training:
    """Model, optimizer, checkpoints and compiled steps of one run, and its phases."""

    spec: ModelSpec
    config: TrainConfig
    info: RunInfo
    strategy: Any
    plan: Plan
    per_replica: int
    watcher: PreemptionWatcher
    watch: Any
    model: Any
    schedule: Any
    step_var: Any
    ckpt: Checkpointer
    steps: Steps
    summaries: Summaries
    sync_state: Callable[[], None]
    restored: Any
    start: int
    timing: steptiming.StepTiming
    board: allocation.Board | None = None  # the chief's allocation summaries
    eval_iterator: Any = None  # built at the first evaluation
    # False beside an evaluator task: save at the evaluation cadence, evaluate nowhere.
    evaluates: bool = True
    completed: int = 0  # the steps done before the one in flight

    @classmethod
    def build(
        cls,
        spec: ModelSpec,
        config: TrainConfig,
        info: RunInfo,
        *,
        strategy: Any,
        plan: Plan,
        per_replica: int,
        watcher: PreemptionWatcher,
        watch: Any,
    ) -> Training:
        """Build the model and optimizer under the strategy, restore the last checkpoint."""
        import keras
        import tensorflow as tf

        with strategy.scope(), collectives.local_initial_values(strategy) as local:
            model = spec.build_model()
            model(tf.zeros((1, *spec.input_shape)), training=False)
            schedule = make_schedule(
                plan.learning_rate, plan.warmup, plan.boundaries, spec.decay_factor
            )
            optimizer = spec.make_optimizer(schedule)
            if config.dtype == "fp16":
                optimizer = compat.loss_scale_optimizer(keras, optimizer)
            optimizer.build(model.trainable_variables)
            step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        random_state = compat.random_state(model)
        saved = {"model": model, "optimizer": optimizer, "step": step_var}
        saved["random"] = random_state  # resumed: the dropout masks of an undisturbed run
        keep, background = config.keep_checkpoints, config.async_checkpoint
        ckpt = Checkpointer(
            config.model_dir, info.is_chief, saved, keep, rank=info.rank, asynchronous=background
        )
        restored, start = _restore(ckpt, step_var, info.is_chief)
        reduce = GradReduce(config.allreduce_dtype, config.bytes_per_pack)
        replicas = int(strategy.num_replicas_in_sync)
        timing = steptiming.from_layout(
            info.layout, replicas, config.timing_every, config.straggler_window
        )
        steps = Steps(
            strategy, model, optimizer, config.batch_size, config.enable_xla, reduce=reduce,
            extra_columns=timing.columns - 2, counter=step_var, guarded=random_state,
        )  # fmt: skip
        sync_state = steps.state_sync() if spec.replica_local_state else no_state_sync
        unset = local and (restored is None or not restored.complete)
        _same_start(steps, start, unset, run_variables(model, optimizer, [step_var, *random_state]))
        evaluates = not sidecar.has_evaluator(info.layout.roles)
        splits = ("train", "eval") if evaluates else ("train",)
        summaries = _summaries(spec, config, info, splits)
        board_dir = None if config.eval_only else config.model_dir  # a start that trains
        board = allocation.start_board(board_dir, info, log_dir(config), start, timing)
        training = cls(
            spec, config, info, strategy, plan, per_replica, watcher, watch,
            model, schedule, step_var, ckpt, steps, summaries, sync_state, restored, start,
            timing,
            board=board, evaluates=evaluates,
        )  # fmt: skip
        watch.at_stall(training.rescue)  # a stalled collective: save before the exit
        return training

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

    def train(self) -> Outcome:
        """Train from ``start`` to ``plan.total`` (or the preemption signal, or the
        ``--stop_threshold``), evaluating and saving on the way."""
        import tensorflow as tf

        config, total, start = self.config, self.plan.total, self.start
        iterator = self._train_iterator()
        progress = reporting.Progress(total, config.batch_size, config.log_every, start)
        outcome = Outcome(start)
        t_start = time.monotonic()
        while outcome.step < total:
            self.completed = outcome.step
            self.watch.enter("step", outcome.step)
            flag = tf.constant(1.0 if self.watcher.requested else 0.0)
            extra = tf.constant(self.timing.extra_input())
            try:
                out = self.steps.train_step(iterator, flag, extra).numpy()
            except Exception as exc:
                if type(exc).__name__ in PEER_FAILURES:
                    self.rescue(type(exc).__name__)
                raise
            outcome.step += 1
            step = outcome.step
            self.watch.finished(step)
            if step == start + 1 and self.info.is_chief:  # the supervisor warms the next ranks
                events.emit("trains", rank=self.info.rank, step=step)
            self.timing.add(out[3:], step)
            outcome.last_loss = float(out[0])
            if outcome.first_loss is None:
                outcome.first_loss = outcome.last_loss
            progress.update(outcome.last_loss, float(out[1]))
            if progress.due(step):
                self._report(progress, step)
            if self.watcher.terminating:  # SIGTERM came: the step counted, saved, then end
                self.end_terminated()
            if out[2] > 0:
                outcome.preempted = True
                break
            if self._evaluate_and_save(step):
                break
        logging.info("%d steps in %.1f s", outcome.step - start, time.monotonic() - t_start)
        return outcome

    def end_terminated(self) -> None:
        """SIGTERM came during a step that completed (and was reported): save it from
        memory, send the trackers what they hold (a bounded wait, within Slurm's
        KillWait), and end as the signal would have. The next start resumes after it."""
        self.rescue("SIGTERM")
        self.summaries.close(EXIT_WAIT_S)
        self.watcher.end_if_terminating()

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

    def rescue(self, why: str) -> None:
        """A peer failed (``why``): save the step this rank's variables hold, from memory
        (slurmtf.training.rescue); the next start resumes there. Never raises: the
        failure that called it is what the rank ends with."""
        started = time.monotonic()
        try:
            step = int(self.step_var.numpy())  # this worker's copy: no collective
            if step == self.completed:  # the broken step was not applied
                self.steps.roll_back()
            saved = self.ckpt.rescue(step, self.info.rank)
        except Exception as exc:  # the state stays where the last save left it
            logging.warning("No save from memory after %s: %s", why, exc)
            return
        if saved is not None:
            seconds = round(time.monotonic() - started, 3)
            events.emit("rescued", rank=self.info.rank, step=step, seconds=seconds, why=why)
            logging.warning("Saved step %d from memory in %.2f s (%s)", step, seconds, why)

    def save(self, step: int) -> None:
        """Save a checkpoint at ``step`` (the chief writes); the watchdog sees the save."""
        started = time.perf_counter()
        self.sync_state()
        self.watch.enter("save", step)
        self.ckpt.save(step)  # the step counts itself (Steps' counter): step_var == step
        self.watch.finished(step, is_train_step=False)
        if self.info.is_chief and self.ckpt.enabled:  # how long training stood still
            seconds = round(time.perf_counter() - started, 4)
            events.emit(
                "checkpoint", step=step, seconds=seconds, asynchronous=self.ckpt.asynchronous
            )

    def finish(self, outcome: Outcome) -> int:
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
        with self.watch.paused():
            self.ckpt.sync()  # every save written before the job says it is done
            self.summaries.close()  # the trackers' last scalars sent (a bounded wait)
        if self.board is not None:
            self.board.close()
        self.timing.close()
        self.done(outcome)
        return EXIT_PREEMPTED if outcome.preempted else 0

    def done(self, outcome: Outcome) -> None:
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


def _summaries(
    spec: ModelSpec, config: TrainConfig, info: RunInfo, splits: tuple[str, ...]
) -> Summaries:
    """The chief's TensorBoard summaries, and the same scalars to the job's trackers
    (the training flags their run's parameters)."""
    flags = {k: v for k, v in dataclasses.asdict(config).items() if v is not None}
    trackers = Trackers.start(os.environ, info.rank, info.is_chief, {"model": spec.name, **flags})
    return Summaries(config.model_dir, info.is_chief, splits, trackers)


def _restore(ckpt: Checkpointer, step_var: Any, is_chief: bool) -> tuple[Any, int]:
    """Restore the newest state; what was restored and the step to start at. The chief's
    ``resumed`` event says where it came from (a checkpoint or a survivor's memory)."""
    restored = ckpt.restore_latest()
    start = int(step_var.numpy())
    if restored is not None and is_chief:
        events.emit("resumed", step=start, source=restored.source, path=restored.path)
    return restored, start


def _same_start(steps: Steps, start: int, unset: bool, variables: list[Any]) -> None:
    """Every rank starts at ``start`` with the chief's values: variables made without
    the chief's broadcast are its values once a restore set them all (every rank read
    the same files: checked here), or else after one all-reduce, which every rank joins
    when any rank's are ``unset``."""
    if steps.check_same_step(start, needs_sync=unset):
        steps.sync_from_chief(variables)
        logging.info("initial values: the chief's, by one all-reduce (no restore set all)")


def run_variables(model: Any, optimizer: Any, others: list[Any]) -> list[Any]:
    """Every variable of the model, the optimizer and ``others``, each once."""
    found: dict[int, Any] = {}
    for variable in [*model.variables, *compat.optimizer_variables(optimizer), *others]:
        found.setdefault(id(variable), variable)
    return list(found.values())


def weights_checksum(model: Any) -> float:
    """Sum of all weights in float64: equal models give equal sums."""
    import numpy as np

    weights = compat.local_weights(model)
    return float(sum(np.asarray(w, dtype=np.float64).sum() for w in weights))
