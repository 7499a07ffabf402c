"""A user script that ends one rank in a chosen way on the job's first attempt.

    python rank_ending.py --end=kill|term|segv|raise|exit2|preempt [--rank=1]

On the first attempt (``SLURM_RESTART_COUNT`` unset or 0) rank ``--rank`` ends as told
(every rank, for ``preempt``: exit 75, as after a saved checkpoint) while the others wait
to be stopped; on a restarted attempt every rank exits 0. No TensorFlow: it tests how a
launch path reports and handles each ending, fast.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "segv": signal.SIGSEGV}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--end", required=True, choices=[*SIGNALS, "raise", "exit2", "preempt"])
    parser.add_argument("--rank", type=int, default=1)
    args = parser.parse_args()
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    print(f"rank {rank} attempt {attempt}: {args.end}", flush=True)
    if attempt > 0:
        return 0
    if args.end == "preempt":
        return 75
    if rank != args.rank:
        time.sleep(120)  # until srun (or --cluster=local) stops this rank
        return 0
    time.sleep(1)  # let every rank start
    if args.end in SIGNALS:
        os.kill(os.getpid(), SIGNALS[args.end])
    if args.end == "raise":
        raise RuntimeError(f"rank {rank} broke on purpose")
    print("usage: bad flag --x", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
