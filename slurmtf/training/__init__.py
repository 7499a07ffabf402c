"""Distributed training shared by the bundled models (imports TensorFlow).

``slurmtf.training`` holds the parts every model needs once: flags, the strategy
choice, the custom training loop, checkpoints, preemption and export. ``import
slurmtf`` never imports this package.

May import: ``slurmtf.runtime`` (teardown, allocator, chief watch), ``slurmtf.tf``,
``slurmtf.cluster``, ``slurmtf.spec`` (node ranges), ``slurmtf.check`` (stragglers),
``slurmtf.datasets``, ``slurmtf.resolver`` and the vocabulary; ``app`` (the models'
``main``, a front end) also ``slurmtf.cli``.
"""

from __future__ import annotations
