"""slurmtf: TensorFlow multi-worker training on Slurm, without hand-written TF_CONFIG.

``import slurmtf`` never imports TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING

from slurmtf.env import SlurmEnv, read_slurm_env
from slurmtf.errors import InputError, SlurmCommandError, SlurmtfError
from slurmtf.gpus import apply_gpu_split
from slurmtf.layout import ClusterLayout
from slurmtf.ports import PortInUseError, ensure_port_free

if TYPE_CHECKING:
    from slurmtf.tf_resolver import SlurmtfClusterResolver

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


# Thin forwarders: importing slurmtf.resolver here would make `python -m slurmtf.resolver`
# warn that the module was imported before it ran.
def resolve(
    environ: Mapping[str, str] | None = None,
    *,
    port_base: int | str | None = None,
    address_template: str | None = None,
) -> ClusterLayout:
    """See :func:`slurmtf.resolver.resolve`."""
    from slurmtf import resolver

    return resolver.resolve(environ, port_base=port_base, address_template=address_template)


def export_tf_config(layout: ClusterLayout, environ: MutableMapping[str, str] = os.environ) -> str:
    """See :func:`slurmtf.resolver.export_tf_config`."""
    from slurmtf import resolver

    return resolver.export_tf_config(layout, environ)


def cluster_resolver(layout: ClusterLayout | None = None) -> SlurmtfClusterResolver:
    """See :func:`slurmtf.resolver.cluster_resolver` (imports TensorFlow)."""
    from slurmtf import resolver

    return resolver.cluster_resolver(layout)
