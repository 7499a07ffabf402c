"""Step rate of Keras 3 ``model.fit`` on the bundled MNIST CNN, to compare with the loop.

    python tests/scripts/fit_step_rate.py --steps=80 --global_batch=64
    python -m slurmtf.submit --cluster=local --nodes=2 \
        --command="python tests/scripts/fit_step_rate.py"

Prints ``{"event": "fit_rate", "steps_per_sec": ...}`` (median step time after
``--warmup`` steps). The custom loop's rate on the same model and batch:
``python -m models.mnist --train_steps=80 --batch_size=64 --log_every=20`` (its
``progress`` events' ``examples_per_sec`` divided by the batch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import tensorflow as tf

from models.mnist import INPUT_SHAPE, build_model
from slurmtf.resolver import cluster_resolver, resolve


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--global_batch", type=int, default=64)
    parser.add_argument("--num_threads", type=int, default=1)
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.num_threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.num_threads)
    layout = resolve()
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster_resolver(layout))
    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, *INPUT_SHAPE)).astype("float32")
    y = rng.integers(0, 10, size=1024).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.global_batch)
    with strategy.scope():
        model = build_model(0.4)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    stamps: list[float] = []
    clock = keras.callbacks.LambdaCallback(on_batch_end=lambda b, logs: stamps.append(time.time()))
    model.fit(data, epochs=1, steps_per_epoch=args.steps, callbacks=[clock], verbose=0)
    steps = np.diff(stamps[args.warmup :])
    print(
        json.dumps(
            {
                "event": "fit_rate",
                "rank": layout.task_index,
                "num_workers": layout.num_workers,
                "global_batch": args.global_batch,
                "steps_per_sec": 1.0 / statistics.median(steps),
                "jit_compile": bool(model.jit_compile),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
