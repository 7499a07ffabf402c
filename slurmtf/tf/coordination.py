"""The coordination service of a multi-worker process, where TensorFlow releases differ.

* Where ``coordination_config_pb2`` lives (:func:`coordination_config`): XLA's copy of
  TSL from 2.19, TensorFlow's own ``tsl`` up to 2.18.
* Whether the service can make every task wait at registration for all the others,
  bounded by ``cluster_register_timeout_in_ms`` (:func:`has_register_barrier`: 2.19 and
  later). :func:`configure` sets the service's timeouts, switches the barrier on where it
  exists and says when the caller must bound the join itself
  (:class:`slurmtf.tf.join_deadline.JoinDeadline`, 2.15 to 2.18).
* The ``ServerDef`` this process joined its peers with (:func:`server_def`), which the
  eager context keeps in private attributes: ``_collective_ops_server_def``
  (MultiWorkerMirroredStrategy's ``enable_collective_ops``), else ``_server_def``
  (``set_server_def``: a remote-eager cluster).

Each is detected by its feature, never by the version string (docs/TENSORFLOW_VERSIONS.md).
Imports TensorFlow only inside the functions.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

# The functions that handle a release difference (docs/TENSORFLOW_VERSIONS.md's table):
# every public function of this module.
RELEASE_DIFFERENCES = ("coordination_config", "has_register_barrier", "configure", "server_def")

# Where ``coordination_config_pb2`` lives: XLA's copy of TSL from 2.19, TensorFlow's own
# ``tsl`` up to 2.18.
COORDINATION_CONFIG_MODULES = (
    "tensorflow.compiler.xla.tsl.protobuf.coordination_config_pb2",
    "tensorflow.tsl.protobuf.coordination_config_pb2",
)
REGISTER_BARRIER_FIELD = "cluster_register_with_barrier"


def coordination_config() -> ModuleType:
    """The ``coordination_config_pb2`` module of this TensorFlow."""
    error: ImportError | None = None
    for name in COORDINATION_CONFIG_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            error = error or exc
    raise ImportError(
        f"no coordination_config_pb2 in this TensorFlow (looked in "
        f"{', '.join(COORDINATION_CONFIG_MODULES)})"
    ) from error


def has_register_barrier(config_module: Any = None) -> bool:
    """Whether the coordination service can make every task wait for all the others at
    registration, bounded by ``cluster_register_timeout_in_ms`` (2.19 and later)."""
    module = config_module or coordination_config()
    fields = module.CoordinationServiceConfig.DESCRIPTOR.fields_by_name
    return REGISTER_BARRIER_FIELD in fields


def configure(
    cluster_spec: Any, heartbeat_timeout: float, registration_timeout: float = 0.0
) -> bool:
    """Set the coordination service's timeouts (MWMS then keeps this config).

    A peer that sends no heartbeat for ``heartbeat_timeout`` is declared dead; TensorFlow's
    default (10 s) can fire on an overloaded node, so it is a flag. With
    ``registration_timeout`` every worker waits at most that long for all workers to
    join at start-up, in a barrier whose error names the workers that never came;
    without it a worker whose peer never starts waits for more than 10 minutes.
    Returns False when the start needs a bound this release lacks (no such barrier: the
    caller bounds it), else True.
    """
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    coordination_config_pb2 = coordination_config()
    if context.context().coordination_service is not None:
        return True  # configured before (this process joined its peers already)
    jobs = [
        coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
        for job in ("chief", "worker")
        if job in cluster_spec.jobs
    ]
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(cluster_spec),
        coordinated_jobs=jobs,
        heartbeat_timeout_in_ms=int(heartbeat_timeout * 1000),
        cluster_register_timeout_in_ms=int(registration_timeout * 1000),
    )
    if not registration_timeout:
        return True
    if not has_register_barrier(coordination_config_pb2):
        return False
    # Not a parameter of configure_coordination_service(): without the barrier only
    # the joining worker's own RegisterTask call is bounded, and the leader, once
    # registered, waits for the others without a limit.
    context.context().coordination_service.cluster_register_with_barrier = True
    return True


def server_def(ctx: Any) -> Any:
    """The ``ServerDef`` the eager context ``ctx`` joined its peers with: collective ops'
    (MultiWorkerMirroredStrategy), else remote eager's; ``None`` when it joined none.
    Both are private attributes, each read with a default, so that a release without one
    reads the other."""
    return getattr(ctx, "_collective_ops_server_def", None) or getattr(ctx, "_server_def", None)
