"""A light stand-in for training: steps at a steady pace, a checkpoint, a resume.

    python steady.py --model_dir=DIR [--steps=60] [--step_s=0.5] [--checkpoint_every=5]

Every rank takes ``--steps`` steps of ``--step_s`` seconds from the last checkpoint
(``DIR/step``, which rank 0 writes every ``--checkpoint_every`` steps) and speaks the
ranks' event protocol (:mod:`slurmtf.events`): ``cluster`` at the start (with the step it
resumed from, the attempt and its node), ``progress`` (rank 0, each step), ``done`` at
the end. No TensorFlow: it tests what surrounds training (the supervisor, its keeper and
watcher, requeues), fast.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from slurmtf.events import emit


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step_s", type=float, default=0.5)
    parser.add_argument("--checkpoint_every", type=int, default=5)
    args = parser.parse_args()
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    checkpoint = args.model_dir / "step"
    start = int(checkpoint.read_text()) if checkpoint.exists() else 0
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    node = os.environ.get("SLURMD_NODENAME", "")
    emit("cluster", rank=rank, start_step=start, restart_count=attempt, node=node)
    for step in range(start + 1, args.steps + 1):
        time.sleep(args.step_s)
        if rank == 0:
            emit("progress", step=step, total=args.steps)
            if step % args.checkpoint_every == 0:
                args.model_dir.mkdir(parents=True, exist_ok=True)
                (args.model_dir / "step.tmp").write_text(str(step))
                (args.model_dir / "step.tmp").replace(checkpoint)
    emit("done", rank=rank, step=args.steps, start_step=start, restart_count=attempt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
