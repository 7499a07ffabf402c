"""slurmtf: TensorFlow multi-worker training on Slurm, without hand-written TF_CONFIG.

``import slurmtf`` never imports TensorFlow.
"""

from __future__ import annotations

from slurmtf.errors import InputError, SlurmCommandError, SlurmtfError

__version__ = "0.1.0"

__all__ = ["InputError", "SlurmCommandError", "SlurmtfError", "__version__"]
