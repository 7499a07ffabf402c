"""Data sets for the bundled models, with checksums: ``slurmtf data ...``.

- ``manifest``: ``MANIFEST.json`` (SHA-256, source, licence), atomic writes, and the check
  the readers in ``models/data`` run before reading.
- ``sample``: a small real MNIST-format sample made from the UCI handwritten digits
  scikit-learn ships (no network needed).
- ``fetch``: full MNIST and CIFAR-10 from their published mirrors.
- ``stage``: a data set staged to node-local scratch, one verified copy per node.

Importing this package imports neither scikit-learn nor TensorFlow.

May import: the vocabulary (``errors``) only; its ``__main__`` hands over to
``slurmtf.cli.data``.
"""

from __future__ import annotations
