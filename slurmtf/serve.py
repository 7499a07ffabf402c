"""``python -m slurmtf.serve``: the ps and worker tasks of a ParameterServerStrategy job
serve until the chief's script ends; the chief runs the command after ``--`` (the servers
are :mod:`slurmtf.runtime.rank.servers`; the same as ``slurmtf serve``).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # the front end is slurmtf.cli.serve
    from slurmtf.cli.serve import main

    sys.exit(main())
