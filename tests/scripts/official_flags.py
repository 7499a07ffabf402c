"""A script that takes the cluster only as TensorFlow's official models do.

    python official_flags.py --worker_hosts=H1:P1,H2:P2 --task_index=N [--steps=8]

It ignores ``TF_CONFIG`` and every Slurm variable: the two flags are all it knows of
the cluster, and it builds ``TF_CONFIG`` from them as the official models'
``configure_cluster`` does. Then a few steps of a tiny model under
MultiWorkerMirroredStrategy (a custom loop: ``strategy.run`` + ``compute_average_loss``)
on seeded data, and one JSON line: ``{"event": "done", "rank", "num_workers",
"worker_hosts", "weights_checksum"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def configure_cluster(worker_hosts: str, task_index: int) -> int:
    """TF_CONFIG from the two flags (as TensorFlow's official models build it)."""
    workers = worker_hosts.split(",")
    os.environ.pop("TF_CONFIG", None)  # only the flags count here
    if len(workers) > 1 and task_index < 0:
        raise ValueError("Must specify task_index when number of workers > 1")
    task = {"type": "worker", "index": 0 if len(workers) == 1 else task_index}
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": task})
    return len(workers)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker_hosts", required=True)
    parser.add_argument("--task_index", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    num_workers = configure_cluster(args.worker_hosts, args.task_index)

    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1))).astype("float32")
    global_batch = 32
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch)
    with strategy.scope():
        kernel = tf.Variable(tf.zeros([8, 1]))
        optimizer = tf.keras.optimizers.SGD(learning_rate=0.05)

    @tf.function
    def step(batch: tuple[tf.Tensor, tf.Tensor]) -> None:
        def replica(features: tf.Tensor, labels: tf.Tensor) -> None:
            with tf.GradientTape() as tape:
                error = tf.reduce_sum(tf.square(features @ kernel - labels), axis=1)
                loss = tf.nn.compute_average_loss(error, global_batch_size=global_batch)
            optimizer.apply_gradients([(tape.gradient(loss, kernel), kernel)])

        strategy.run(replica, args=batch)

    batches = iter(strategy.experimental_distribute_dataset(data))
    for _ in range(args.steps):
        step(next(batches))
    done = {
        "event": "done",
        "rank": args.task_index,
        "num_workers": num_workers,
        "worker_hosts": args.worker_hosts,
        "weights_checksum": float(tf.reduce_sum(kernel)),
    }
    print(json.dumps(done), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
