"""Distributed training shared by the bundled models (imports TensorFlow).

``slurmtf.training`` holds the parts every model needs once: flags, the strategy
choice, the custom training loop, checkpoints, preemption and export. ``import
slurmtf`` never imports this package.
"""

from __future__ import annotations
