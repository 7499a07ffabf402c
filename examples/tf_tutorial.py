"""A script in the shape of TensorFlow's "Multi-worker training with Keras" tutorial.

It knows nothing of Slurm or slurmtf: it reads ``TF_CONFIG``, builds
``tf.distribute.MultiWorkerMirroredStrategy()`` without arguments and calls ``tf.keras``
``model.fit``. It runs unchanged on every task of a job:

    sbatch jobs/train.sbatch examples/tf_tutorial.py
    LEGACY_KERAS=1 sbatch jobs/train.sbatch examples/tf_tutorial.py      # tf.keras = tf_keras
    slurmtf submit --nodes=2 --command="python examples/tf_tutorial.py"
    python -m slurmtf.run examples/tf_tutorial.py                        # one worker, no Slurm

(each task starts it through ``python -m slurmtf.run``, which exports ``TF_CONFIG`` and
applies slurmtf's fixes first). The tutorial downloads MNIST; this copy trains on seeded
synthetic images of the same shape, so it runs offline, and ends with one JSON line
``{"event": "done", "rank": ..., "weights_checksum": ...}``: every rank, and one worker
with the same global batch (``--per_worker_batch`` times the workers), end with the same
weights.
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf


def mnist_dataset(batch_size, seed=7, n=1024):
    rng = np.random.default_rng(seed)
    x_train = rng.random((n, 28, 28), dtype=np.float32)
    y_train = rng.integers(0, 10, size=n).astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    return train_dataset.repeat().batch(batch_size)


def build_and_compile_cnn_model():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(28, 28)),
            tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(8, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.01),
        metrics=["accuracy"],
    )
    return model


parser = argparse.ArgumentParser(description="TensorFlow's multi-worker tutorial, offline")
parser.add_argument("--per_worker_batch", type=int, default=64)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--steps_per_epoch", type=int, default=6)
args = parser.parse_args()

tf.keras.utils.set_random_seed(1)
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = args.per_worker_batch * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)

with strategy.scope():
    # Model building/compiling need to be within `strategy.scope()`.
    multi_worker_model = build_and_compile_cnn_model()

history = multi_worker_model.fit(
    multi_worker_dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=2
)
checksum = float(sum(np.asarray(w, np.float64).sum() for w in multi_worker_model.get_weights()))
done = {
    "event": "done",
    "rank": tf_config["task"]["index"],
    "num_workers": num_workers,
    "keras": "tf_keras" if os.environ.get("TF_USE_LEGACY_KERAS") == "1" else "keras3",
    "loss": history.history["loss"][-1],
    "weights_checksum": checksum,
}
print(json.dumps(done), flush=True)
