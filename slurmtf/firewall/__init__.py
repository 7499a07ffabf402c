"""A per-job firewall for TensorFlow's open gRPC ports, as a Slurm node prolog/epilog.

- ``rules``: the pure part (ports, addresses, nftables text).
- ``node``: what runs on the node (``prolog.sh`` and ``epilog.sh`` beside this file, which
  slurm.conf names: ``slurmtf firewall --print-config``).

May import: ``slurmtf.cluster`` (ports) and ``slurmtf.errors``; ``node`` also
``slurmtf.slurm`` (it runs in slurmd's prolog: nothing that imports TensorFlow).
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
PROLOG = HERE / "prolog.sh"
EPILOG = HERE / "epilog.sh"
