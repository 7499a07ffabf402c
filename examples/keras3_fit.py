"""Keras 3 ``model.fit`` across every task of a Slurm job: only the README's two lines added.

    sbatch jobs/train.sbatch examples/keras3_fit.py --epochs=3      # 2 nodes
    python examples/keras3_fit.py                                     # one worker, no Slurm

Trains a small classifier on seeded synthetic data with a GLOBAL batch of
``--global_batch`` (split over the workers), then prints one JSON line
``{"event": "done", "rank": ..., "weights_checksum": ...}``: every rank, and a one-worker
run with the same global batch and seed, end with the same weights.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import tensorflow as tf

from slurmtf.resolver import cluster_resolver, resolve


def make_data(seed: int, n: int = 2048, features: int = 20, classes: int = 4) -> tuple:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    y = np.argmax(x @ rng.normal(size=(features, classes)), axis=1).astype("int32")
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps_per_epoch", type=int, default=8)
    parser.add_argument("--global_batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    # The README's lines: this task's place in the job, and the strategy over all tasks.
    layout = resolve()
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster_resolver(layout))

    import keras  # Keras 3, as tf.keras

    keras.utils.set_random_seed(args.seed)
    x, y = make_data(args.seed)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.global_batch)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((x.shape[1],)), keras.layers.Dense(32, activation="relu"),
             keras.layers.Dense(4)]
        )  # fmt: skip
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    history = model.fit(
        dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=2
    )
    checksum = float(sum(np.asarray(w, np.float64).sum() for w in model.get_weights()))
    print(
        json.dumps(
            {
                "event": "done",
                "rank": layout.task_index,
                "num_workers": layout.num_workers,
                "loss": history.history["loss"][-1],
                "weights_checksum": checksum,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
