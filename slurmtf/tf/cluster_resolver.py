"""A TensorFlow ``ClusterResolver`` built from a :class:`~slurmtf.cluster.layout.ClusterLayout`.

Imports TensorFlow; reach it through :func:`slurmtf.resolver.cluster_resolver` so that
``import slurmtf`` stays TensorFlow-free. Unlike TensorFlow's ``SlurmClusterResolver`` it
sets ``task_type``/``task_id`` at construction (from ``SLURMTF_JOBS`` roles: chief, ps,
worker, evaluator), keeps Slurm's host order, honours the task distribution and
heterogeneous jobs, and never runs ``nvidia-smi``.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from slurmtf.cluster.layout import ClusterLayout


class SlurmtfClusterResolver(tf.distribute.cluster_resolver.ClusterResolver):  # type: ignore[misc]
    """Cluster of ``layout.cluster()``; this task is ``layout.task_type`` number
    ``layout.task_id`` (``worker`` number ``SLURM_PROCID`` without roles).

    A single-worker layout without roles gives an empty cluster spec, so that
    ``MultiWorkerMirroredStrategy`` runs locally without opening a port. Every task type
    speaks ``rpc_layer`` (gRPC). ``exclude`` leaves task types out of the cluster spec:
    the bundled models build their strategy without the sidecar evaluator.
    """

    def __init__(
        self, layout: ClusterLayout, *, rpc_layer: str = "grpc", exclude: tuple[str, ...] = ()
    ) -> None:
        self._layout = layout
        self._exclude = exclude  # task types left out of the cluster (e.g. the evaluator)
        self.task_type = layout.task_type
        self.task_id = layout.task_id
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
        if self._local:
            return tf.train.ClusterSpec({})
        return tf.train.ClusterSpec(self._cluster())

    def _cluster(self) -> dict[str, list[str]]:
        cluster = self._layout.cluster()
        return {role: tasks for role, tasks in cluster.items() if role not in self._exclude}

    @property
    def _local(self) -> bool:
        return self._layout.is_single_worker and self._layout.roles is None

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """The ``grpc://host:port`` of a task (this one by default); ``""`` when local."""
        if self._local:
            return ""
        task_type = self.task_type if task_type is None else task_type
        task_id = self.task_id if task_id is None else task_id
        tasks = self._cluster().get(task_type, [])
        if not 0 <= int(task_id) < len(tasks):
            raise ValueError(f"no task {task_type}:{task_id} in this cluster")
        address = tasks[int(task_id)]
        layer = self.rpc_layer if rpc_layer is None else rpc_layer
        return f"{layer}://{address}" if layer else address

    def num_accelerators(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        config_proto: Any = None,
    ) -> dict[str, int]:
        """GPUs of this task: what TensorFlow sees, capped by Slurm's binding; no nvidia-smi.

        A ps, or the chief of a ps job, reports none unless ``SLURMTF_GPU_SPLIT=off``
        (:mod:`slurmtf.cluster.gpu_plan`).
        """
        del task_type, task_id, config_proto
        if not self._layout.uses_gpus and self._layout.gpu_split != "off":
            return {}
        count = len(tf.config.list_physical_devices("GPU"))
        if self._layout.gpus is not None:
            count = min(count, len(self._layout.gpus))
        return {"GPU": count} if count else {}
