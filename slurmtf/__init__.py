"""slurmtf: TensorFlow multi-worker training on Slurm, without hand-written TF_CONFIG.

``import slurmtf`` never imports TensorFlow.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Any

from slurmtf.cluster.env import SlurmEnv, read_slurm_env
from slurmtf.cluster.gpu_plan import apply_gpu_split
from slurmtf.cluster.layout import ClusterLayout
from slurmtf.cluster.ports import PortInUseError, ensure_port_free
from slurmtf.errors import InputError, SlurmCommandError, SlurmtfError

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


# Where the modules of slurmtf 0.1.0's flat layout, and of the flat slurmtf.runtime,
# went (docs/ARCHITECTURE.md): the old names keep importing, as the same module objects,
# for users' scripts and for jobs pickled before the upgrade. A module split in two maps
# to the one that holds what its users read (``attempts``: the recovery record;
# ``jobsettings``: the settings; ``batchhost``: the watcher step); the former module
# ``slurmtf.runtime.recovery`` is the package now, whose names it forwards.
MOVED_MODULES = {
    "slurmtf.allocator": "slurmtf.runtime.rank.allocator",
    "slurmtf.collectives": "slurmtf.tf.collectives",
    "slurmtf.console": "slurmtf.monitor.console",
    "slurmtf.env": "slurmtf.cluster.env",
    "slurmtf.gpu_ids": "slurmtf.cluster.gpu_ids",
    "slurmtf.gpus": "slurmtf.cluster.gpu_plan",
    "slurmtf.hostlists": "slurmtf.cluster.hostlists",
    "slurmtf.jobrecord": "slurmtf.monitor.records",
    "slurmtf.jobscripts": "slurmtf.spec.bundled",
    "slurmtf.jobspec": "slurmtf.spec.jobspec",
    "slurmtf.jobvalues": "slurmtf.spec.values",
    "slurmtf.keras_compat": "slurmtf.tf.keras_compat",
    "slurmtf.layout": "slurmtf.cluster.layout",
    "slurmtf.localstep": "slurmtf.local.step",
    "slurmtf.noderange": "slurmtf.spec.noderange",
    "slurmtf.placement": "slurmtf.cluster.placement",
    "slurmtf.plot": "slurmtf.monitor.plot",
    "slurmtf.ports": "slurmtf.cluster.ports",
    "slurmtf.roles": "slurmtf.cluster.roles",
    "slurmtf.runner": "slurmtf.slurm.runner",
    "slurmtf.runtime.allocator": "slurmtf.runtime.rank.allocator",
    "slurmtf.runtime.attempts": "slurmtf.runtime.recovery.record",
    "slurmtf.runtime.batchhost": "slurmtf.runtime.batch_host.watcher_step",
    "slurmtf.runtime.chief_watch": "slurmtf.runtime.rank.chief_watch",
    "slurmtf.runtime.children": "slurmtf.runtime.job.children",
    "slurmtf.runtime.commands": "slurmtf.runtime.job.commands",
    "slurmtf.runtime.endings": "slurmtf.runtime.recovery.endings",
    "slurmtf.runtime.follow": "slurmtf.runtime.job.follow",
    "slurmtf.runtime.heartbeat": "slurmtf.runtime.batch_host.heartbeat",
    "slurmtf.runtime.held_port": "slurmtf.runtime.rank.held_port",
    "slurmtf.runtime.joblog": "slurmtf.runtime.job_log",
    "slurmtf.runtime.jobsettings": "slurmtf.runtime.job.settings",
    "slurmtf.runtime.jobslurm": "slurmtf.runtime.slurm_calls",
    "slurmtf.runtime.keeper": "slurmtf.runtime.batch_host.keeper",
    "slurmtf.runtime.launcher": "slurmtf.runtime.rank.launcher",
    "slurmtf.runtime.node_choice": "slurmtf.runtime.recovery.node_choice",
    "slurmtf.runtime.placement": "slurmtf.runtime.job.step_nodes",
    "slurmtf.runtime.script": "slurmtf.runtime.rank.script",
    "slurmtf.runtime.servers": "slurmtf.runtime.rank.servers",
    "slurmtf.runtime.srun_status": "slurmtf.runtime.recovery.endings",
    "slurmtf.runtime.staging": "slurmtf.runtime.job.staging",
    "slurmtf.runtime.supervisor": "slurmtf.runtime.job.supervisor",
    "slurmtf.runtime.teardown": "slurmtf.runtime.rank.teardown",
    "slurmtf.runtime.watcher": "slurmtf.runtime.batch_host.watcher",
    "slurmtf.shell": "slurmtf.spec.shell",
    "slurmtf.stragglers": "slurmtf.check.stragglers",
    "slurmtf.sweeps": "slurmtf.monitor.sweeps",
    "slurmtf.sweeptable": "slurmtf.monitor.sweep_rows",
    "slurmtf.teardown": "slurmtf.runtime.rank.teardown",
    "slurmtf.tf_import": "slurmtf.tf.lean_import",
    "slurmtf.tf_resolver": "slurmtf.tf.cluster_resolver",
    "slurmtf.training.join_deadline": "slurmtf.tf.join_deadline",
    "slurmtf.training.progress_watch": "slurmtf.training.watchdog",
    "slurmtf.watch": "slurmtf.monitor.status",
}


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a module of the old flat layout as the module that now holds it."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED_MODULES[spec.name]
        warnings.warn(f"{spec.name} is now {new}", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import machinery gave the module the old name's spec: give it back its own.
        module.__spec__ = module.__spec__.loader_state if module.__spec__ else None


if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(MovedModuleFinder())
