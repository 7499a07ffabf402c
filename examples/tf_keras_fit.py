"""A tf.keras (Keras 2, the ``tf_keras`` package) ``model.fit`` script across the job.

    LEGACY_KERAS=1 sbatch jobs/train.sbatch examples/tf_keras_fit.py --epochs=3
    python -m slurmtf.submit --legacy_keras --nodes=2 --command="python examples/tf_keras_fit.py"
    TF_USE_LEGACY_KERAS=1 python examples/tf_keras_fit.py           # one worker, no Slurm

Needs ``pip install "slurmtf[keras2]"`` and ``TF_USE_LEGACY_KERAS=1`` in every task (the
switches above set it), so that ``tf.keras`` is ``tf_keras``. Same model, data and JSON
``done`` line as ``examples/keras3_fit.py``.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import tensorflow as tf

from slurmtf.resolver import cluster_resolver, resolve


def make_data(seed: int, n: int = 2048, features: int = 20, classes: int = 4) -> tuple:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    y = np.argmax(x @ rng.normal(size=(features, classes)), axis=1).astype("int32")
    return x, y


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps_per_epoch", type=int, default=8)
    parser.add_argument("--global_batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    keras = tf.keras
    if not keras.Model.__module__.startswith("tf_keras"):
        print(
            f"tf.keras is {keras.Model.__module__}, not tf_keras. HINT: set "
            "TF_USE_LEGACY_KERAS=1 (LEGACY_KERAS=1 sbatch ..., or submit --legacy_keras) "
            'and pip install "slurmtf[keras2]"',
            file=sys.stderr,
        )
        return 2
    layout = resolve()
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster_resolver(layout))

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
                "keras": keras.Model.__module__.split(".")[0],
                "loss": history.history["loss"][-1],
                "weights_checksum": checksum,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
