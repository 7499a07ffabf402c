"""Your Keras model and data in slurmtf's distributed custom training loop (``slurmtf.train``).

    sbatch jobs/train.sbatch examples/custom_loop.py --train_steps=16 --model_dir=...
    python examples/custom_loop.py --train_steps=16                  # one worker, no Slurm

Same model and seeded synthetic data as ``examples/keras3_fit.py``. The loop brings the
strategy over the Slurm job, sharded input, checkpoints and resume in ``--model_dir``,
save-and-exit-75 on USR2, JSON event lines (the last is ``{"event": "done", ...,
"weights_checksum": ...}``) and the stall watchdog. ``--help`` lists its flags.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from slurmtf import train

FEATURES, CLASSES, EXAMPLES = 20, 4, 2048


def make_data(seed: int, n: int = EXAMPLES) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    y = np.argmax(x @ rng.normal(size=(FEATURES, CLASSES)), axis=1).astype("int32")
    return x, y


def build_model() -> Any:
    import keras

    return keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(32, activation="relu"),
         keras.layers.Dense(CLASSES)]
    )  # fmt: skip


def make_spec(config: train.TrainConfig) -> train.ModelSpec:
    import keras
    import tensorflow as tf

    x, y = make_data(config.seed)

    def dataset(ctx: Any, per_replica_batch: int, skip_batches: int = 0) -> Any:
        # Every worker builds the whole (small) dataset and keeps its shard.
        data = tf.data.Dataset.from_tensor_slices((x, y))
        return train.shard_and_batch(data, ctx, per_replica_batch, skip_batches)

    return train.ModelSpec(
        name="custom_loop_example",
        build_model=build_model,
        input_shape=(FEATURES,),
        train_dataset=dataset,
        eval_dataset=dataset,
        num_train_examples=EXAMPLES,
        num_eval_examples=EXAMPLES,
        reference_batch=64,  # --learning_rate is for this global batch
        make_optimizer=lambda schedule: keras.optimizers.SGD(learning_rate=schedule),
        own_data=True,
    )


if __name__ == "__main__":
    sys.exit(train.main("examples.custom_loop", make_spec, batch_size=64, learning_rate=0.1))
