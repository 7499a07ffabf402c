"""Asynchronous saves of slurmtf's Checkpointer, in one process: prints one JSON line.

``python async_saves.py MODEL_DIR``: four saves of a Keras model with dropout and Adam
(the variables changed right after each save), a rescue the last save holds, a
non-chief's saves; then the restored values against those of the last save.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf

from slurmtf.tf import compat
from slurmtf.training import rescue
from slurmtf.training.checkpoints import Checkpointer


def main(model_dir: Path) -> None:
    import keras

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dropout(0.5),
             keras.layers.Dense(2)]
        )  # fmt: skip
        optimizer = keras.optimizers.Adam()
        optimizer.build(model.trainable_variables)
        step = tf.Variable(0, dtype=tf.int64, trainable=False)
    objects = {"model": model, "optimizer": optimizer, "step": step}
    objects["random"] = compat.random_state(model)
    chief = Checkpointer(str(model_dir), True, objects, asynchronous=True)
    other = Checkpointer(str(model_dir), False, objects, rank=1, asynchronous=True)
    saved: list[np.ndarray] = []
    for number in range(1, 5):
        for variable in [*model.trainable_variables, *compat.optimizer_variables(optimizer)]:
            variable.assign_add(tf.ones_like(variable))
        step.assign(number)
        if number == 4:  # a survivor's rescue of step 4: pruned once the save of 4 is written
            rescue.save(tf.train.Checkpoint(**objects), model_dir, 4, 1)
        chief.save(number)
        other.save(number)
        saved = [compat.variable_value(v).numpy() for v in model.weights]
        for variable in model.trainable_variables:  # after the save: not in it
            variable.assign(tf.zeros_like(variable))
    rescues_before_sync = len(rescue.found(model_dir))
    chief.sync()
    other.sync()
    latest = chief.latest()
    chief.restore_latest()
    restored = [compat.variable_value(v).numpy() for v in model.weights]
    print(json.dumps({
        "asynchronous": chief.asynchronous,
        "latest_step": latest.step if latest else None,
        "equal": all(np.array_equal(a, b) for a, b in zip(saved, restored, strict=True)),
        "rescues_before_sync": rescues_before_sync,
        "rescues_after_sync": len(rescue.found(model_dir)),
        "files": sorted(p.name for p in model_dir.iterdir()),
        "step": int(step.numpy()),
        "scratch_left": [p.name for p in Path(tempfile.gettempdir()).glob("slurmtf-ckpt-*")],
    }))  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]))
