"""The step counts and learning-rate schedule of a run: the workers train by them and the
sidecar evaluator reads the final step and the evaluation size from them."""

from __future__ import annotations

import dataclasses
from typing import Any

from slurmtf.training.flags import TrainConfig, scaled_learning_rate
from slurmtf.training.model_spec import ModelSpec


@dataclasses.dataclass(frozen=True)
class Plan:
    """Step counts and the learning-rate schedule's numbers."""

    steps_per_epoch: int
    total: int
    eval_every: int
    eval_steps: int
    learning_rate: float
    warmup: int
    boundaries: list[int]

    @classmethod
    def of(cls, spec: ModelSpec, config: TrainConfig) -> Plan:
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
