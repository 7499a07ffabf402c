"""``python -m slurmtf.datasets``: same as ``slurmtf data``."""

from __future__ import annotations

import sys

from slurmtf.cli.data import main

sys.exit(main())
