"""A TensorFlow ``ClusterResolver`` built from a :class:`~slurmtf.layout.ClusterLayout`.

Imports TensorFlow; reach it through :func:`slurmtf.resolver.cluster_resolver` so that
``import slurmtf`` stays TensorFlow-free. Unlike TensorFlow's ``SlurmClusterResolver`` it
sets ``task_type``/``task_id`` at construction, keeps Slurm's host order, honours the
task distribution and never runs ``nvidia-smi``.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from slurmtf.layout import ClusterLayout

TASK_TYPE = "worker"


class SlurmtfClusterResolver(tf.distribute.cluster_resolver.ClusterResolver):  # type: ignore[misc]
    """Cluster of ``layout.workers``; this task is ``worker`` number ``layout.task_index``.

    A single-worker layout gives an empty cluster spec, so that
    ``MultiWorkerMirroredStrategy`` runs locally without opening a port.
    """

    def __init__(self, layout: ClusterLayout, *, rpc_layer: str = "grpc") -> None:
        self._layout = layout
        self.task_type = TASK_TYPE
        self.task_id = layout.task_index
        self.rpc_layer = rpc_layer

    @property
    def layout(self) -> ClusterLayout:
        return self._layout

    @property
    def rpc_layer(self) -> str:
        return self._rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str) -> None:
        self._rpc_layer = rpc_layer

    def cluster_spec(self) -> Any:
        if self._layout.is_single_worker:
            return tf.train.ClusterSpec({})
        return tf.train.ClusterSpec({TASK_TYPE: list(self._layout.workers)})

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """The ``grpc://host:port`` of a task (this one by default); ``""`` when local."""
        if self._layout.is_single_worker:
            return ""
        task_type = self.task_type if task_type is None else task_type
        task_id = self.task_id if task_id is None else task_id
        if task_type != TASK_TYPE or not 0 <= int(task_id) < self._layout.num_workers:
            raise ValueError(f"no task {task_type}:{task_id} in this cluster")
        address = self._layout.workers[int(task_id)]
        layer = self.rpc_layer if rpc_layer is None else rpc_layer
        return f"{layer}://{address}" if layer else address

    def num_accelerators(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        config_proto: Any = None,
    ) -> dict[str, int]:
        """GPUs of this task: what TensorFlow sees, capped by Slurm's binding; no nvidia-smi."""
        del task_type, task_id, config_proto
        count = len(tf.config.list_physical_devices("GPU"))
        if self._layout.gpus is not None:
            count = min(count, len(self._layout.gpus))
        return {"GPU": count} if count else {}
