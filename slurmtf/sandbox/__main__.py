"""``python -m slurmtf.sandbox``: same as ``slurmtf sandbox``."""

from __future__ import annotations

import sys

from slurmtf.sandbox.cli import main

sys.exit(main())
