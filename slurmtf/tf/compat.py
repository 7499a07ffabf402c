"""What differs between the TensorFlow releases slurmtf supports (2.15 to 2.21), in one place.

Each difference is detected by its feature (an import that moved, a protobuf field, an
attribute), never by the version string; docs/TENSORFLOW_VERSIONS.md lists them with the
releases that have each one. Imports TensorFlow only inside the functions.
"""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType
from typing import Any

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
