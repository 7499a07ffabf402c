"""One worker of a 2-worker MultiWorkerMirroredStrategy on loopback: builds the MNIST
model and Adam without the initial values' broadcast, then syncs them from the chief.

    python tests/scripts/initial_values.py INDEX PORT_BASE

Prints one JSON line: whether the broadcast was skipped, whether the ranks agreed a
sync was needed, and the weights checksum, step and random state before and after.
"""

from __future__ import annotations

import json
import os
import sys


def main(index: int, base: int) -> None:
    workers = [f"localhost:{base}", f"localhost:{base + 1}"]
    task = {"type": "worker", "index": index}
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": task})
    import keras
    import tensorflow as tf

    from models import mnist
    from slurmtf.tf import collectives, compat
    from slurmtf.training import phases
    from slurmtf.training.steps import Steps

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope(), collectives.local_initial_values(strategy) as local:
        model = mnist.build_model()
        model(tf.zeros((1, *mnist.INPUT_SHAPE)), training=False)
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)
        step = tf.Variable(3 * index, dtype=tf.int64, trainable=False)
    random_state = compat.random_state(model)

    def seen() -> dict[str, object]:
        return {
            "checksum": phases.weights_checksum(model),
            "step": int(step.numpy()),
            "random": [compat.variable_value(v).numpy().tolist() for v in random_state],
        }

    before = seen()
    steps = Steps(strategy, model, optimizer, 100, False, counter=step)
    needed = steps.check_same_step(0, needs_sync=local and index == 1)
    steps.sync_from_chief(phases.run_variables(model, optimizer, [step, *random_state]))
    print(json.dumps({"local": local, "needed": needed, "before": before, "after": seen()}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
