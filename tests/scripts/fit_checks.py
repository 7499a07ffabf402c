"""A Keras ``model.fit`` script for the tests: every feature a multi-worker user relies on.

``--mode=features``: fit with metrics and validation data, ModelCheckpoint, BackupAndRestore
and TensorBoard under ``--model_dir``; then evaluate and predict. ``--mode=preempt``: fit
with :class:`slurmtf.fit.PreemptionCheckpoint`, sleeping ``--sleep`` s per batch so that a
signal lands mid-run (a ``batch`` line each, with the optimizer's step).
``--mode=backup``: fit with BackupAndRestore alone, as slowly, so that a rank killed
mid-run resumes from the last epoch's backup. ``--mode=tracked``: fit
with PreemptionCheckpoint and :class:`slurmtf.fit.TrackerLogger` (the job's tracker
runs), rank 1 SIGKILLing itself after global step ``--kill_at`` of the job's first
attempt, so that the restart computes its epoch again. Every result is a JSON
line (``fit``, ``evaluate``, ``predict``, ``epoch_end``, ``done``); rank and worker count
come from the resolver.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from slurmtf.resolver import cluster_resolver, resolve

FEATURES, CLASSES = 20, 4


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def data(seed: int, n: int) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    y = np.argmax(x @ rng.normal(size=(FEATURES, CLASSES)), axis=1).astype("int32")
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--mode", choices=["features", "preempt", "backup", "tracked"], default="features"
    )
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--global_batch", type=int, default=32)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--kill_at", type=int, default=0)
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    layout = resolve()
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster_resolver(layout))
    keras = tf.keras
    keras.utils.set_random_seed(7)
    rank = layout.task_index
    x, y = data(7, args.steps * args.global_batch)  # one epoch = the whole set, same order
    vx, vy = data(8, 2 * args.global_batch)
    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.global_batch)
    val = tf.data.Dataset.from_tensor_slices((vx, vy)).batch(args.global_batch)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"),
             keras.layers.Dense(CLASSES)]
        )  # fmt: skip
        model.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    d = Path(args.model_dir)
    on_epoch = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: emit("epoch_end", rank=rank, epoch=epoch)
    )
    if args.mode == "features":
        callbacks = [
            keras.callbacks.ModelCheckpoint(
                str(d / "ckpt" / "epoch{epoch}.weights.h5"), save_weights_only=True
            ),
            keras.callbacks.BackupAndRestore(str(d / "backup"), delete_checkpoint=False),
            keras.callbacks.TensorBoard(str(d / "tb"), write_graph=False),
            on_epoch,
        ]
        history = model.fit(train, epochs=args.epochs, validation_data=val, callbacks=callbacks,
                            verbose=2)  # fmt: skip
        emit("fit", rank=rank, history={k: [float(v) for v in vs]
                                        for k, vs in history.history.items()})  # fmt: skip
        results = model.evaluate(val, return_dict=True, verbose=0)
        emit("evaluate", rank=rank, **{k: float(v) for k, v in results.items()})
        predictions = np.asarray(model.predict(val, verbose=0))
        # The same rows predicted by this worker's own copy of the model, for comparison.
        local = np.asarray(model(vx, training=False))
        emit(
            "predict",
            rank=rank,
            shape=list(predictions.shape),
            max_abs_error=float(np.abs(np.sort(predictions, 0) - np.sort(local, 0)).max()),
        )
    elif args.mode == "backup":  # a rank killed mid-run: the restarted run resumes from it
        slow = keras.callbacks.LambdaCallback(on_batch_end=lambda b, logs: time.sleep(args.sleep))
        backup = keras.callbacks.BackupAndRestore(str(d / "backup"))
        model.fit(train, epochs=args.epochs, callbacks=[backup, slow, on_epoch], verbose=2)
    elif args.mode == "tracked":
        fit_tracked(model, train, val, args, rank)
    else:
        fit_preempted(model, train, args, rank, on_epoch)
    checksum = float(sum(np.asarray(w, np.float64).sum() for w in model.get_weights()))
    emit("done", rank=rank, num_workers=layout.num_workers, weights_checksum=checksum)


def fit_preempted(
    model: Any, train: Any, args: argparse.Namespace, rank: int, on_epoch: Any
) -> None:
    from slurmtf.fit import PreemptionCheckpoint

    def batch_end(batch: int, logs: Any) -> None:
        step = int(model.optimizer.iterations.numpy())
        emit("batch", rank=rank, batch=batch, step=step)
        time.sleep(args.sleep)

    slow = tf.keras.callbacks.LambdaCallback(on_train_batch_end=batch_end)
    backup = PreemptionCheckpoint(str(Path(args.model_dir) / "backup"))
    model.fit(train, epochs=args.epochs, callbacks=[backup, slow, on_epoch], verbose=2)


def fit_tracked(model: Any, train: Any, val: Any, args: argparse.Namespace, rank: int) -> None:
    from slurmtf.fit import PreemptionCheckpoint, TrackerLogger

    first = os.environ.get("SLURM_RESTART_COUNT", "0") == "0"

    def maybe_die(batch: int, logs: Any) -> None:
        if first and rank == 1 and int(model.optimizer.iterations.numpy()) == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    callbacks = [
        PreemptionCheckpoint(str(Path(args.model_dir) / "backup")),
        TrackerLogger(params={"epochs": args.epochs}),
        tf.keras.callbacks.LambdaCallback(on_train_batch_end=maybe_die),
    ]
    model.fit(train, epochs=args.epochs, validation_data=val, callbacks=callbacks, verbose=0)


if __name__ == "__main__":
    main()
