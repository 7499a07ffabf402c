"""``python -m slurmtf.firewall prolog|epilog``: what prolog.sh and epilog.sh run."""

from __future__ import annotations

import sys

from slurmtf.firewall.node import main

sys.exit(main(sys.argv[1:]))
