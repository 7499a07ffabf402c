"""``model.fit`` of a small model on one replica or on two CPU replicas (MirroredStrategy):
prints its final weights as JSON. ``python fit_replicas.py REPLICAS fix|plain``."""

import json
import sys

import numpy as np
import tensorflow as tf

replicas, how = int(sys.argv[1]), sys.argv[2]
cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
applied: list[str] = []
if how == "fix":
    from slurmtf.tf.keras_distribute import fix_older_keras

    applied = fix_older_keras()
import keras  # noqa: E402  (after the fix, as slurmtf run arms it)

if replicas == 2:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
else:
    strategy = tf.distribute.get_strategy()
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = rng.normal(size=(64, 1)).astype("float32")
with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
weights = [w.tolist() for w in model.get_weights()]
print(json.dumps({"weights": weights, "keras": keras.__version__, "applied": applied}))
