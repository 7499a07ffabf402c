"""What differs between the Keras releases of the TensorFlow releases slurmtf supports
(2.15 to 2.21) in the APIs the training loop, ``model.fit`` and the export use.

Each difference is detected by its feature (an attribute, an argument), never by the
version string; docs/TENSORFLOW_VERSIONS.md lists them with the
releases that have each one. The coordination service's differences are
:mod:`slurmtf.tf.coordination`'s. Imports TensorFlow only inside the functions.
"""

from __future__ import annotations

import inspect
from typing import Any

# The functions that handle a release difference (docs/TENSORFLOW_VERSIONS.md's table):
# every public function of this module.
RELEASE_DIFFERENCES = (
    "is_keras_3",
    "export_saved_model",
    "set_precision_policy",
    "loss_scale_optimizer",
    "scale_loss",
    "unscale_gradients",
    "skips_aggregation",
    "bypass_gradient_sum",
    "apply_gradients",
    "variable_value",
    "optimizer_variables",
    "random_state",
    "local_weights",
    "fit_initial_epoch",
    "async_checkpoint_options",
    "mend_async_copy",
)


def is_keras_3(keras: Any) -> bool:
    """Whether the ``keras`` module is Keras 3 (TensorFlow 2.16 and later): it has
    ``keras.ops``, which Keras 2 (TensorFlow 2.15's ``tf.keras``) and tf_keras lack."""
    return hasattr(keras, "ops")


def export_saved_model(model: Any, path: str) -> None:
    """``model.export`` as a TensorFlow SavedModel, quietly where the release can be quiet:
    Keras 3.3-3.5 take no ``verbose`` (always quiet), Keras 2 (2.15) no ``format``."""
    accepts = inspect.signature(model.export).parameters
    options: dict[str, Any] = {}
    if "format" in accepts:
        options["format"] = "tf_saved_model"
    if "verbose" in accepts:
        options["verbose"] = False
    model.export(path, **options)


def set_precision_policy(keras: Any, name: str) -> None:
    """Keras's global dtype policy (``mixed_bfloat16``...): ``set_dtype_policy`` in Keras 3,
    ``set_global_policy`` in Keras 2 (TensorFlow 2.15's ``tf.keras``)."""
    precision = keras.mixed_precision
    setter = getattr(precision, "set_dtype_policy", None) or precision.set_global_policy
    setter(name)


# Loss scaling and the gradient sum: Keras 3 (TensorFlow 2.16+) and Keras 2 (2.15's tf.keras).
def loss_scale_optimizer(keras: Any, optimizer: Any) -> Any:
    """``optimizer`` under dynamic loss scaling (fp16): ``keras.optimizers`` in Keras 3,
    ``keras.mixed_precision`` in Keras 2."""
    wrapper = getattr(keras.optimizers, "LossScaleOptimizer", None)
    return (wrapper or keras.mixed_precision.LossScaleOptimizer)(optimizer)


def scale_loss(optimizer: Any, loss: Any) -> Any:
    """The loss to differentiate: scaled by a loss-scale optimizer, else as it is."""
    if hasattr(optimizer, "scale_loss"):  # Keras 3: every optimizer (identity unless scaling)
        return optimizer.scale_loss(loss)
    if hasattr(optimizer, "get_scaled_loss"):  # Keras 2's LossScaleOptimizer
        return optimizer.get_scaled_loss(loss)
    return loss


def unscale_gradients(optimizer: Any, grads: Any) -> Any:
    """Gradients of a scaled loss, unscaled where the optimizer leaves it to the caller
    (Keras 2; Keras 3's ``apply_gradients`` unscales them itself)."""
    if not hasattr(optimizer, "scale_loss") and hasattr(optimizer, "get_unscaled_gradients"):
        return optimizer.get_unscaled_gradients(grads)
    return grads


def skips_aggregation(optimizer: Any) -> bool:
    """Whether ``apply_gradients`` can be told the gradients are summed already
    (``skip_gradients_aggregation``: Keras 2; Keras 3 has no such argument)."""
    return "skip_gradients_aggregation" in inspect.signature(optimizer.apply_gradients).parameters


# Keras 3's TensorFlow optimizer sums the replicas' gradients in this method.
GRADIENT_SUM = "_all_reduce_sum_gradients"


def bypass_gradient_sum(optimizer: Any) -> bool:
    """Make Keras 3's optimizer (and a loss-scale optimizer's inner one) apply gradients
    as given, summed already by the caller: its ``_all_reduce_sum_gradients`` hook made
    the identity. False, and nothing changed, when an optimizer has no such hook."""
    inner = getattr(optimizer, "inner_optimizer", None)  # LossScaleOptimizer
    targets = [optimizer] if inner is None else [optimizer, inner]
    if not all(hasattr(target, GRADIENT_SUM) for target in targets):
        return False
    for target in targets:
        object.__setattr__(target, GRADIENT_SUM, _as_given)
    return True


def _as_given(grads_and_vars: Any) -> Any:
    return list(grads_and_vars)


def apply_gradients(optimizer: Any, grads_and_vars: Any, *, summed: bool) -> Any:
    """``optimizer.apply_gradients``; ``summed``: the caller all-reduced the gradients."""
    if summed and skips_aggregation(optimizer):
        return optimizer.apply_gradients(grads_and_vars, skip_gradients_aggregation=True)
    return optimizer.apply_gradients(grads_and_vars)


def variable_value(variable: Any) -> Any:
    """A variable's current value: a property of Keras 3's variables, a method of
    TensorFlow's own (the variables of Keras 2 models)."""
    value = variable.value
    return value() if callable(value) else value


def optimizer_variables(optimizer: Any) -> list[Any]:
    """The optimizer's own variables (its step count, slots, loss scale): a property in
    Keras 3 and in Keras 2's optimizers of 2.11+, a method in Keras 2's legacy ones."""
    found = optimizer.variables
    return list(found() if callable(found) else found)


def random_state(model: Any) -> list[Any]:
    """What the model's random layers (dropout...) draw from, as checkpointable variables,
    so that a resumed run draws what an undisturbed one would: Keras 3 keeps each layer's
    seed generators' state in ``_seed_generators``, outside TensorFlow's tracking. Keras 2
    has none: it draws from TensorFlow's stateful random ops, whose state no checkpoint
    can hold, so there a resumed run draws other masks (docs/FAILURES.md)."""
    layers = model._flatten_layers() if hasattr(model, "_flatten_layers") else []
    return [
        generator.state
        for layer in layers
        for generator in getattr(layer, "_seed_generators", None) or ()
        if hasattr(generator, "state")
    ]


def local_weights(model: Any) -> list[Any]:
    """The model's weights on this worker as numpy arrays, read without a collective:
    each variable's first local copy. Keras 2 keeps batch norm's moving statistics in
    on-read variables, whose read outside a replica all-reduces them: a collective only
    the reading rank joins (the chief's export), which hangs every rank at the next one.
    The replicas' statistics are averaged at evaluations and checkpoints
    (``slurmtf.training.steps.Steps.state_sync``)."""
    import numpy as np

    strategy = model.distribute_strategy
    values = []
    for variable in model.weights:
        # Keras 3: the TensorFlow variable behind the Keras one; Keras 2: the variable.
        held = (
            variable.value
            if isinstance(getattr(type(variable), "value", None), property)
            else variable
        )
        values.append(np.asarray(strategy.experimental_local_results(held)[0]))
    return values


def fit_initial_epoch(model: Any) -> int | None:
    """The epoch ``model.fit`` starts at after ``BackupAndRestore`` restored: Keras 3 keeps
    it on the model (``_initial_epoch``), Keras 2 and tf_keras in its training state (the
    last epoch backed up, -1 for none, plus one). None when neither is there."""
    if hasattr(model, "_initial_epoch"):
        return int(model._initial_epoch or 0)
    saved = getattr(getattr(model, "_training_state", None), "_ckpt_saved_epoch", None)
    return None if saved is None else int(saved.numpy()) + 1


def async_checkpoint_options() -> Any | None:
    """``tf.train.CheckpointOptions`` whose saves write in the background (a copy of the
    variables in host memory first): ``enable_async`` (2.15+), the older
    ``experimental_enable_async_checkpoint``; None where the release has neither."""
    import tensorflow as tf

    names = inspect.signature(tf.train.CheckpointOptions).parameters
    for name in ("enable_async", "experimental_enable_async_checkpoint"):
        if name in names:
            return tf.train.CheckpointOptions(**{name: True})
    return None


def mend_async_copy(keras: Any) -> None:
    """Make a Keras 3 variable's copy for an asynchronous save reuse the copy of the
    first save: Keras 3 (3.0 to at least 3.15) makes a new ``tf.Variable`` at every
    copy, and TensorFlow copies inside a ``tf.function``, so the second asynchronous save
    fails ("tf.function only supports singleton tf.Variables"). Detected by behaviour: a
    variable copied twice, mended in this process when the second copy is a new one, on
    the class that defines the copy."""
    import tensorflow as tf
    from tensorflow.python.util.object_identity import ObjectIdentityDictionary

    make = getattr(keras, "Variable", None)
    if make is None or not hasattr(make, "_copy_trackable_to_cpu"):
        return  # Keras 2: TensorFlow's own variables, which reuse their copy
    probe = make(0.0, trainable=False)
    copies = ObjectIdentityDictionary()  # as TensorFlow's copy passes it
    probe._copy_trackable_to_cpu(copies)
    first = copies[probe]
    probe._copy_trackable_to_cpu(copies)
    if copies[probe] is first:
        return
    # The class that defines it: ``keras.Variable`` may be a subclass of the backend's
    # (Keras 3.3's ``backend.exports.Variable``), while layers make the backend's own.
    made: Any = next(c for c in type(probe).__mro__ if "_copy_trackable_to_cpu" in vars(c))

    def copy_to_cpu(self: Any, object_map: dict[Any, Any]) -> None:
        self.value._copy_trackable_to_cpu(object_map)
        if self in object_map:
            object_map[self].assign(object_map[self.value])
        else:
            object_map[self] = tf.Variable(object_map[self.value])

    made._copy_trackable_to_cpu = copy_to_cpu
