"""A user script whose rank 1 is SIGKILLed on each of its first ``--fails`` attempts.

    python failing_progress.py --fails=4 [--stuck]

Rank 0 reports a ``progress`` event first: step ``10 * (attempt + 1)``, each attempt
further than the one before, or step 10 on every attempt with ``--stuck`` (a job that
keeps failing at the same place). Then, while the attempt (``SLURM_RESTART_COUNT``) is
below ``--fails``, rank 1 kills itself and the others wait to be stopped; from then on
every rank exits 0. No TensorFlow: it tests what ``MAX_RESTARTS`` counts, fast.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from slurmtf import events


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fails", type=int, required=True)
    parser.add_argument("--stuck", action="store_true")
    args = parser.parse_args()
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    if rank == 0:
        events.emit("progress", step=10 if args.stuck else 10 * (attempt + 1), total=100)
    if attempt >= args.fails:
        return 0
    if rank != 1:
        time.sleep(120)  # until srun stops this rank
        return 0
    time.sleep(1)  # let rank 0 report
    os.kill(os.getpid(), signal.SIGKILL)
    return 1


if __name__ == "__main__":
    sys.exit(main())
