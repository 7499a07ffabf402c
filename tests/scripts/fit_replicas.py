"""``model.fit`` of a small model on one replica or on two CPU replicas (MirroredStrategy):
prints its final weights, its history (loss and a metric) and ``evaluate``'s result as
JSON. ``python fit_replicas.py REPLICAS fix|plain``."""

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
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
if "gradient sum" in applied:  # Keras 3.3 builds state in fit's first step: build it first
    with strategy.scope():
        model.optimizer.build(model.trainable_variables)
    model.evaluate(x[:16], y[:16], batch_size=16, verbose=0)  # the compiled metrics
history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
evaluated = model.evaluate(x, y, batch_size=16, verbose=0)
weights = [w.tolist() for w in model.get_weights()]
print(json.dumps({"weights": weights, "history": history, "evaluate": evaluated,
                  "keras": keras.__version__, "applied": applied}))  # fmt: skip
