"""``python -m slurmtf.cli``: the same as the ``slurmtf`` console script."""

from __future__ import annotations

import sys

from slurmtf.cli import main

sys.exit(main())
