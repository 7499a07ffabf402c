"""The MNIST CNN of TensorFlow's official models, trained data-parallel across the job.

    python -m models.mnist --model_dir=/shared/run1 --data_dir=/data/mnist --train_epochs=10

Without ``--data_dir`` it trains on synthetic learnable data and says so. See docs/MODELS.md.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Any

from absl import flags

from slurmtf.train import ModelSpec, TrainConfig
from slurmtf.train import main as train_main

flags.DEFINE_float("dropout_rate", 0.4, "Dropout before the last layer (official: 0.4).")

NUM_CLASSES = 10
INPUT_SHAPE = (28, 28, 1)
SYNTHETIC_TRAIN, SYNTHETIC_EVAL = 6_000, 1_000


def build_model(dropout_rate: float = 0.4) -> Any:
    """Conv 5x5x32, pool, conv 5x5x64, pool, dense 1024, dropout, dense 10 (float32 logits)."""
    import keras

    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input(INPUT_SHAPE),
            layers.Conv2D(32, 5, padding="same", activation="relu"),
            layers.MaxPooling2D(2, 2, padding="same"),
            layers.Conv2D(64, 5, padding="same", activation="relu"),
            layers.MaxPooling2D(2, 2, padding="same"),
            layers.Flatten(),
            layers.Dense(1024, activation="relu"),
            layers.Dropout(dropout_rate),
            layers.Dense(NUM_CLASSES, dtype="float32"),
        ],
        name="mnist_cnn",
    )


def make_spec(config: TrainConfig) -> ModelSpec:
    """The MNIST model, data and optimizer (Adam, as in the official model)."""
    from .data import mnist as mnist_data
    from .data.splits import from_reader, synthetic_split

    dropout = float(flags.FLAGS.dropout_rate)
    if config.synthetic:
        split = synthetic_split(
            INPUT_SHAPE, NUM_CLASSES, config.seed, SYNTHETIC_TRAIN, SYNTHETIC_EVAL
        )
    else:
        data_dir = str(config.data_dir)
        sizes = mnist_data.num_examples(data_dir, True), mnist_data.num_examples(data_dir, False)
        split = from_reader(mnist_data.dataset, *sizes, data_dir=data_dir, seed=config.seed)

    def make_optimizer(schedule: Any) -> Any:
        import keras

        return keras.optimizers.Adam(learning_rate=schedule)

    return ModelSpec(
        name="mnist",
        build_model=functools.partial(build_model, dropout),
        input_shape=INPUT_SHAPE,
        **split.spec_fields(),
        reference_batch=100,
        make_optimizer=make_optimizer,
    )


# How users run it: `models.mnist` in a checkout, `slurmtf_models.mnist` installed (its
# `--help`, error prefixes and hints name the module that actually runs).
PROGRAM = __spec__.name if __spec__ is not None else "models.mnist"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m models.mnist`` (argv without the program name); returns the exit code."""
    return train_main(PROGRAM, make_spec, argv, batch_size=100, learning_rate=1e-3)


if __name__ == "__main__":
    sys.exit(main())
