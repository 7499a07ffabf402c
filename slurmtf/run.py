"""``python -m slurmtf.run SCRIPT|-m MODULE [ARGS]``: an unmodified training script on
every task, with ``TF_CONFIG``, its GPUs and the TensorFlow/Keras fixes set before its
first line (the launcher is :mod:`slurmtf.runtime.rank.script`; the same as ``slurmtf run``).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # the front end is slurmtf.cli.run
    from slurmtf.cli.run import main

    sys.exit(main())
