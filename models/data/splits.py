"""A data set as the training loop takes it: train and eval dataset functions, and sizes."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from . import synthetic


@dataclasses.dataclass(frozen=True)
class Split:
    """``train``/``evaluate``: ``(ctx, per_replica_batch, skip_batches=0) -> dataset``."""

    train: Callable[..., Any]
    evaluate: Callable[..., Any]
    num_train: int
    num_eval: int

    def spec_fields(self) -> dict[str, Any]:
        """The :class:`~slurmtf.training.loop.ModelSpec` fields this split fills."""
        return {
            "train_dataset": self.train,
            "eval_dataset": self.evaluate,
            "num_train_examples": self.num_train,
            "num_eval_examples": self.num_eval,
        }


def from_reader(
    dataset: Callable[..., Any], num_train: int, num_eval: int, **options: Any
) -> Split:
    """A reader's ``dataset(ctx, batch, *, training, **options)`` for both splits."""
    return Split(
        functools.partial(dataset, training=True, **options),
        functools.partial(dataset, training=False, **options),
        num_train,
        num_eval,
    )


def synthetic_split(
    shape: tuple[int, int, int], num_classes: int, seed: int, num_train: int, num_eval: int
) -> Split:
    """Learnable synthetic data (:mod:`models.data.synthetic`) of ``shape``."""
    options: dict[str, Any] = {"shape": shape, "num_classes": num_classes, "seed": seed}
    return Split(
        functools.partial(synthetic.dataset, training=True, num_examples=num_train, **options),
        functools.partial(synthetic.dataset, training=False, num_examples=num_eval, **options),
        num_train,
        num_eval,
    )
