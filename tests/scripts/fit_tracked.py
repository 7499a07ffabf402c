"""A ``model.fit`` script that logs to the job's tracker runs with
:class:`slurmtf.fit.TrackerLogger`, resuming with :class:`slurmtf.fit.PreemptionCheckpoint`.

``--kill_at=N``: rank 1 SIGKILLs itself after global step N of the job's first attempt,
so that the restart computes again the epoch it was in. Prints a ``done`` JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from slurmtf.fit import PreemptionCheckpoint, TrackerLogger
from slurmtf.resolver import cluster_resolver, resolve

FEATURES, CLASSES = 8, 3


def data(seed: int, n: int) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    y = np.argmax(x @ rng.normal(size=(FEATURES, CLASSES)), axis=1).astype("int32")
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--kill_at", type=int, default=0)
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    layout = resolve()
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster_resolver(layout))
    keras = tf.keras
    keras.utils.set_random_seed(7)
    x, y = data(7, args.steps * 16)
    vx, vy = data(8, 32)
    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    val = tf.data.Dataset.from_tensor_slices((vx, vy)).batch(16)
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES)])
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    first = os.environ.get("SLURM_RESTART_COUNT", "0") == "0"

    def maybe_die(batch: int, logs: Any) -> None:
        step = int(model.optimizer.iterations.numpy())
        if first and layout.task_index == 1 and step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    callbacks = [
        PreemptionCheckpoint(str(Path(args.model_dir) / "backup")),
        TrackerLogger(params={"epochs": args.epochs}),
        keras.callbacks.LambdaCallback(on_train_batch_end=maybe_die),
    ]
    model.fit(train, epochs=args.epochs, validation_data=val, callbacks=callbacks, verbose=0)
    step = int(model.optimizer.iterations.numpy())
    print(json.dumps({"event": "done", "rank": layout.task_index, "step": step}), flush=True)


if __name__ == "__main__":
    main()
