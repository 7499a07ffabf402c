"""slurmtf: TensorFlow multi-worker training on Slurm, without hand-written TF_CONFIG.

``import slurmtf`` never imports TensorFlow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slurmtf.env import SlurmEnv, read_slurm_env
from slurmtf.errors import InputError, SlurmCommandError, SlurmtfError
from slurmtf.gpus import apply_gpu_split
from slurmtf.layout import ClusterLayout
from slurmtf.ports import PortInUseError, ensure_port_free

if TYPE_CHECKING:
    from slurmtf.resolver import cluster_resolver, export_tf_config, resolve

__version__ = "0.1.0"

__all__ = [
    "ClusterLayout",
    "InputError",
    "PortInUseError",
    "SlurmCommandError",
    "SlurmEnv",
    "SlurmtfError",
    "__version__",
    "apply_gpu_split",
    "cluster_resolver",
    "ensure_port_free",
    "export_tf_config",
    "read_slurm_env",
    "resolve",
]


# The resolver's functions load on first use (PEP 562): importing slurmtf.resolver here
# would make `python -m slurmtf.resolver` warn that it was imported before it ran.
_LAZY = {"resolve", "export_tf_config", "cluster_resolver"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from slurmtf import resolver

        return getattr(resolver, name)
    raise AttributeError(f"module 'slurmtf' has no attribute {name!r}")
