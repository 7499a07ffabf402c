"""The sidecar evaluator: one task that evaluates every checkpoint the workers write.

With ``SLURMTF_JOBS=worker:N,evaluator:1`` (or the models' ``--evaluator`` flag, which
makes the step's last task the evaluator) the workers train without pausing to evaluate
(they still save at the same cadence) and build their ``MultiWorkerMirroredStrategy``
from the chief and workers only; the evaluator joins no collective and no coordination
service. It restores each new checkpoint of ``<model_dir>/checkpoints`` in step order
(the ``checkpoint`` state file lists complete checkpoints only), evaluates it on
``--eval_steps`` batches of the GLOBAL batch (the examples the in-loop evaluation of all
workers together sees) and emits the same ``eval`` event, plus a TensorBoard summary
under ``<model_dir>/eval``.

It ends by itself: after evaluating the final step (``--train_steps``, or the epochs'
steps); when the workers' chief stops answering on its port (the workers ended: it
evaluates what is left, then leaves); when the chief never answered within
``--registration_timeout`` (exit 1); on the preemption signal (exit 75). Under srun's
``--kill-on-bad-exit`` a failed worker also ends it.

The pure parts (roles, the final step, which checkpoints are due) need no TensorFlow.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from absl import logging

from slurmtf.errors import InputError
from slurmtf.runtime.rank.chief_watch import START_TIMEOUT_S, Chief, ChiefNeverStarted, ChiefWatch
from slurmtf.training.checkpoints import checkpoint_step

EVALUATOR = "evaluator"
TRAINING_ROLES = ("chief", "worker")
POLL_S = 1.0  # between looks at the checkpoint state file and the chief's port
RESTORE_TRIES = 3  # a listed checkpoint that fails this often is skipped
_JOBS_HINT = "use SLURMTF_JOBS=worker:N,evaluator:1 (or --evaluator: the last task evaluates)"


def has_evaluator(roles: Sequence[str] | None) -> bool:
    """Whether the step has an evaluator task (the workers then skip evaluations)."""
    return roles is not None and EVALUATOR in roles


def evaluator_jobs(num_tasks: int) -> str:
    """The ``SLURMTF_JOBS`` value ``--evaluator`` stands for: the last task evaluates."""
    if num_tasks < 2:
        raise InputError(
            "--evaluator",
            True,
            f"needs a task to train and one to evaluate, but the step has {num_tasks}",
            "run one more task than workers, e.g. sbatch -N3 jobs/mnist.sbatch --evaluator",
        )
    return f"worker:{num_tasks - 1},{EVALUATOR}:1"


def check_model_roles(roles: Sequence[str] | None, jobs: str) -> None:
    """The bundled models train chief/worker tasks, with at most one evaluator beside.

    (Two evaluators are refused earlier, by :mod:`slurmtf.cluster.roles`.)
    """
    if roles is None:
        return
    others = sorted(set(roles) - {*TRAINING_ROLES, EVALUATOR})
    if others:
        raise InputError(
            "SLURMTF_JOBS",
            jobs,
            f"gives {', '.join(others)} tasks, which the bundled models do not run "
            "(they train with MultiWorkerMirroredStrategy)",
            f"{_JOBS_HINT}; parameter-server jobs: jobs/parameter_server.sbatch",
        )
    if not any(role in TRAINING_ROLES for role in roles):
        raise InputError("SLURMTF_JOBS", jobs, "gives no task a worker's role", _JOBS_HINT)


def check_sidecar_config(stop_threshold: float | None, eval_only: bool) -> None:
    """Flags that need the workers' own evaluation do not go with an evaluator task."""
    if stop_threshold is not None:
        raise InputError(
            "--stop_threshold",
            stop_threshold,
            "needs the workers' own evaluation, and an evaluator task takes it over",
            "drop --stop_threshold, or run without the evaluator task",
        )
    if eval_only:
        raise InputError(
            "--eval_only",
            True,
            "evaluates on the workers; an evaluator task evaluates checkpoints as they come",
            "drop --eval_only, or run without the evaluator task",
        )


def training_tasks(roles: Sequence[str]) -> int:
    """How many tasks train (chief and workers)."""
    return sum(role in TRAINING_ROLES for role in roles)


def due(paths: Sequence[str], last: int | None) -> list[tuple[int, str]]:
    """The listed checkpoints newer than step ``last``, oldest first."""
    steps = [(checkpoint_step(p), p) for p in paths]
    return sorted(
        (step, path) for step, path in steps if step is not None and (last is None or step > last)
    )


def chief_address(cluster: dict[str, list[str]]) -> Chief:
    """Where the training cluster's chief listens (the chief, else worker 0)."""
    return Chief.at((cluster.get("chief") or cluster["worker"])[0])


def listed_checkpoints(directory: Path) -> list[str]:
    """Every complete checkpoint the state file lists (``[]`` before the first save)."""
    import tensorflow as tf

    try:
        state = tf.train.get_checkpoint_state(str(directory))
    except Exception as exc:  # a state file being replaced: read it again next time
        logging.info("Checkpoint state not readable yet (%s)", exc)
        return []
    return [] if state is None else list(state.all_model_checkpoint_paths)


def run_evaluator(spec: Any, config: Any, info: Any) -> int:
    """The evaluator task's whole run; returns its exit code (see the module doc)."""
    from slurmtf.training.preemption import PreemptionWatcher

    if not config.model_dir:
        raise InputError(
            "--model_dir", None, "is needed: the evaluator reads the workers' checkpoints there",
            "pass --model_dir on a file system every node shares (the job scripts do)",
        )  # fmt: skip
    watcher = PreemptionWatcher(config.preemption_signal).install()
    try:
        code = _Evaluator.build(spec, config, info).run(watcher)
    finally:
        watcher.uninstall()
    if info.layout.in_slurm and not info.layout.is_single_worker:
        from slurmtf.runtime.rank import teardown

        teardown.leave_alone(code)  # a task of a job step: end now, as the workers do
    return code


class _Evaluator:
    """The model, its evaluation step and the checkpoints still to evaluate."""

    def __init__(self, spec: Any, config: Any, info: Any, plan: Any, **parts: Any) -> None:
        self.spec, self.config, self.info, self.plan = spec, config, info, plan
        self.checkpoint = parts["checkpoint"]
        self.step_var = parts["step_var"]
        self.eval_step = parts["eval_step"]
        self.iterator = parts["iterator"]
        self.summaries = parts["summaries"]
        self.directory = Path(config.model_dir) / "checkpoints"
        self.last: int | None = None
        self.evaluated = 0
        self.failures: dict[int, int] = {}

    @classmethod
    def build(cls, spec: Any, config: Any, info: Any) -> _Evaluator:
        """A local strategy, the workers' global batch and plan, the model, the step."""
        import tensorflow as tf

        from slurmtf import events
        from slurmtf.training.export import Summaries
        from slurmtf.training.flags import check_batch_size
        from slurmtf.training.plan import Plan
        from slurmtf.training.process import fit_batch, set_up_process
        from slurmtf.training.steps import make_eval_step
        from slurmtf.training.strategy import describe, make_strategy, plan_strategy

        num_gpus, log_path = set_up_process(config, info)
        strategy = make_strategy(plan_strategy("auto", "auto", 1, num_gpus))
        roles = info.layout.roles or ()
        workers_replicas = training_tasks(roles) * max(info.planned_replicas, 1)
        # the workers' global batch
        config, _ = fit_batch(config, workers_replicas, max(training_tasks(roles), 1))
        replicas = int(strategy.num_replicas_in_sync)
        per_replica = check_batch_size(config.batch_size, replicas)
        plan = Plan.of(spec, config)
        events.emit(
            "cluster", rank=info.rank, role=EVALUATOR, num_workers=info.num_workers,
            workers=list(info.workers), strategy=describe(strategy), replicas=replicas,
            gpus=num_gpus, cuda_visible_devices=info.cuda_visible_devices,
            global_batch=config.batch_size, per_replica_batch=per_replica,
            final_step=plan.total, restart_count=info.restart_count, log_file=log_path,
        )  # fmt: skip
        with strategy.scope():
            model = spec.build_model()
            model(tf.zeros((1, *spec.input_shape)), training=False)
            step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        batches = plan.eval_steps

        def pipeline(ctx: Any) -> Any:
            per_pipeline = batches * (ctx.num_replicas_in_sync // ctx.num_input_pipelines)
            return spec.eval_dataset(ctx, per_replica).take(per_pipeline).repeat()

        return cls(
            spec, config, info, plan,
            checkpoint=tf.train.Checkpoint(model=model, step=step_var),
            step_var=step_var,
            eval_step=make_eval_step(strategy, model),
            iterator=iter(strategy.distribute_datasets_from_function(pipeline)),
            summaries=Summaries(config.model_dir, True, splits=("eval",)),
        )  # fmt: skip

    def run(
        self,
        watcher: Any,
        sleep: Callable[[float], None] = time.sleep,
        watch: ChiefWatch | None = None,
    ) -> int:
        """Evaluate checkpoints as they come until the final step, the workers' end, or
        the preemption signal."""
        from slurmtf.contracts import EXIT_FAILURE, EXIT_PREEMPTED

        if watch is None:
            chief = chief_address(self.info.layout.cluster())
            watch = ChiefWatch(chief, self.config.registration_timeout or START_TIMEOUT_S)
        logging.info(
            "Evaluating the checkpoints of %s up to step %d", self.directory, self.plan.total
        )
        ending = False
        while True:
            if self._evaluate_due():
                return self._done(0)
            if watcher.requested:
                logging.warning("Preempted: the evaluator stops, exiting %d", EXIT_PREEMPTED)
                return self._done(EXIT_PREEMPTED, preempted=True)
            if ending:
                logging.warning(
                    "The workers ended before step %d; last evaluated step: %s",
                    self.plan.total,
                    self.last,
                )
                return self._done(0)
            try:
                ending = watch.gone()  # one more look at the checkpoints, then leave
            except ChiefNeverStarted as exc:
                print(
                    f"{self.info.program}: {exc}. HINT: the evaluator waits for the workers "
                    "as long as --registration_timeout; read the workers' logs",
                    file=sys.stderr,
                )
                return self._done(EXIT_FAILURE)
            if not ending:
                sleep(POLL_S)

    def _evaluate_due(self) -> bool:
        """Evaluate every listed checkpoint newer than the last; True at the final step."""
        for step, path in due(listed_checkpoints(self.directory), self.last):
            if not self._restore(step, path):
                return False  # listed but not readable (yet): next round
            self._evaluate(step, path)
            self.last = step
            if step >= self.plan.total:
                return True
        return False

    def _restore(self, step: int, path: str) -> bool:
        try:
            self.checkpoint.restore(path).expect_partial()
            return True
        except Exception as exc:  # deleted by max_to_keep meanwhile, or still moving
            tries = self.failures[step] = self.failures.get(step, 0) + 1
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            logging.warning("Cannot read checkpoint %s (try %d): %s", path, tries, first)
            if tries >= RESTORE_TRIES:
                logging.warning("Skipping checkpoint %s", path)
                self.last = step
            return False

    def _evaluate(self, step: int, path: str) -> None:
        from slurmtf import events

        totals = [0.0, 0.0, 0.0]
        started = time.monotonic()
        for _ in range(self.plan.eval_steps):
            out = self.eval_step(self.iterator).numpy()
            totals = [a + float(b) for a, b in zip(totals, out, strict=True)]
        count = max(totals[2], 1)
        result = {"loss": totals[0] / count, "accuracy": totals[1] / count}
        epoch = step / self.plan.steps_per_epoch
        events.emit(
            "eval", step=step, epoch=epoch, examples=int(totals[2]), rank=self.info.rank,
            role=EVALUATOR, checkpoint=path, **result,
        )  # fmt: skip
        self.summaries.scalars("eval", step, result)
        self.evaluated += 1
        logging.info(
            "eval at step %d: loss %.4f accuracy %.4f (%.1f s)%s",
            step, result["loss"], result["accuracy"], time.monotonic() - started,
            " (SYNTHETIC data)" if self.config.synthetic else "",
        )  # fmt: skip

    def _done(self, code: int, *, preempted: bool = False) -> int:
        from slurmtf import events

        events.emit(
            "done", rank=self.info.rank, role=EVALUATOR, step=self.last,
            evaluated=self.evaluated, final_step=self.plan.total,
            restart_count=self.info.restart_count, preempted=preempted,
        )  # fmt: skip
        return code
