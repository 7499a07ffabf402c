"""``python -m slurmtf.sandbox``: same as ``slurmtf sandbox``."""

from __future__ import annotations

import sys

from slurmtf.cli.sandbox import main

sys.exit(main())
