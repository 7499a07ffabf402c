"""``python -m slurmtf.launch``: what each task of a ``slurmtf submit`` job runs.

The launcher itself is :mod:`slurmtf.runtime.rank.launcher`; ``TaskLauncher`` is named here
too because submitit pickles it under this module's name (jobs queued before an upgrade
must still load).
"""

from __future__ import annotations

import sys

from slurmtf.runtime.rank.launcher import TaskLauncher

__all__ = ["TaskLauncher"]

if __name__ == "__main__":  # the front end is slurmtf.cli.launch
    from slurmtf.cli.launch import main

    sys.exit(main())
