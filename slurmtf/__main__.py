"""``python -m slurmtf``: the same as the ``slurmtf`` console script (``slurmtf job ...``
is how the job scripts hand a job to its supervisor)."""

from __future__ import annotations

import sys

from slurmtf.cli import main

sys.exit(main())
