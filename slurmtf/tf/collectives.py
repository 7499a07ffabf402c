"""Collective settings every multi-worker process of slurmtf uses (TensorFlow edge)."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

# The functions that handle a release difference (docs/TENSORFLOW_VERSIONS.md's table).
RELEASE_DIFFERENCES = ("reuse_collective_instance_keys", "local_initial_values")


def reuse_collective_instance_keys() -> bool:
    """Keep a multi-worker process's memory flat however many steps it runs.

    By default TensorFlow gives every *call* of a ``tf.function`` fresh collective
    instance keys, and its collective parameter resolver keeps a record per key for the
    life of the process: about 1.6 KB per collective op executed (2 GB/h for ResNet-20
    with synchronised batch norm on two CPU workers, measured). Keys assigned when the
    function is traced are reused by every call, and memory stays flat. That is
    TensorFlow's own alternative (``_prefer_unique_instance_key``); it needs every rank
    to trace its collective functions in the same order, which a training loop that runs
    the same code on every rank does. Call before the first collective; returns whether
    the switch exists in this TensorFlow (it is logged when it does not).
    """
    from tensorflow.python.distribute import cross_device_utils

    launcher = cross_device_utils.CollectiveReplicaLauncher
    if not hasattr(launcher, "_prefer_unique_instance_key"):
        log.warning(
            "This TensorFlow has no CollectiveReplicaLauncher._prefer_unique_instance_key: "
            "memory may grow with every collective op in long multi-worker runs"
        )
        return False
    launcher._prefer_unique_instance_key = False
    return True


def abort_collectives(message: str) -> None:
    """Fail every collective op of this process now, and every later one (any thread may
    call it): a rank whose step was ended learns it at once, instead of at TensorFlow's
    heartbeat timeout, when its peer died between two of its collectives. The same call
    MultiWorkerMirroredStrategy's own health check makes."""
    from tensorflow.python.eager import context

    context.context().abort_collective_ops(14, message)  # 14: UNAVAILABLE, a peer's failure


@contextlib.contextmanager
def local_initial_values(strategy: Any) -> Iterator[bool]:
    """Inside, ``MultiWorkerMirroredStrategy`` creates each variable from this worker's
    own initial value, without the broadcast from the chief it sends for every variable
    (one collective round trip each: 28 for MNIST and Adam, 0.25 s of an idle 2-core
    machine, 0.9 s of a busy one, at every start and restart). Yields whether it did so:
    the caller then makes the variables the chief's by a restore every rank reads, or by
    one all-reduce (slurmtf.training.steps). Other strategies, a single worker, or a
    TensorFlow without the hook (the extended strategy's
    ``_get_variable_creator_initial_value``, 2.15 to 2.21): unchanged, False."""
    extended = strategy.extended
    original = getattr(extended, "_get_variable_creator_initial_value", None)
    if original is None or int(getattr(extended, "_num_workers", 1)) < 2:
        yield False
        return

    def initial_value(replica_id: int, device: Any, primary_var: Any, **kwargs: Any) -> Any:
        if replica_id != 0:  # a worker's other replicas copy its first: unchanged
            return original(replica_id, device, primary_var, **kwargs)
        return functools.partial(_own_initial_value, device, kwargs)

    extended._get_variable_creator_initial_value = initial_value
    try:
        yield True
    finally:
        del extended._get_variable_creator_initial_value  # the class's own again


def _own_initial_value(device: Any, kwargs: dict[str, Any]) -> Any:
    """A variable's initial value on ``device``, as TensorFlow computes it before its
    broadcast (``kwargs``: the variable's creation arguments)."""
    import tensorflow as tf
    from tensorflow.python.trackable import base

    with tf.device(device):
        value = kwargs["initial_value"]
        if callable(value):
            value = value()
        if isinstance(value, base.CheckpointInitialValue):
            value = value.wrapped_value
        return tf.convert_to_tensor(value, dtype=kwargs.get("dtype"))
