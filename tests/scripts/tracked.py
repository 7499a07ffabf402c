"""A user's script that logs to MLflow and W&B as the trackers' own examples do.

    python tracked.py --model_dir=DIR [--steps=40] [--step_s=0.5] [--checkpoint_every=10]

Every rank calls ``mlflow.start_run()`` and ``wandb.init()`` with no run id (slurmtf's
environment decides which run each gets) and takes ``--steps`` steps of ``--step_s``
seconds from the last checkpoint (``DIR/step``, which rank 0 writes every
``--checkpoint_every`` steps), logging the metric ``step`` at each step that the job's
run has not logged yet (:func:`slurmtf.monitor.tracking.last_logged_step`). It speaks the
ranks' event protocol (:mod:`slurmtf.events`): ``cluster`` at the start, ``progress``
(rank 0, each step), ``done`` at the end. No TensorFlow.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import mlflow
import wandb

from slurmtf.events import emit
from slurmtf.monitor.tracking import last_logged_step


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step_s", type=float, default=0.5)
    parser.add_argument("--checkpoint_every", type=int, default=10)
    args = parser.parse_args()
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    checkpoint = args.model_dir / "step"
    start = int(checkpoint.read_text()) if checkpoint.exists() else 0
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    logged = last_logged_step(os.environ)
    run = mlflow.start_run()
    board = wandb.init(project="slurmtf-e2e")
    emit("cluster", rank=rank, start_step=start, restart_count=attempt, last_logged=logged,
         mlflow_run=run.info.run_id, wandb_run=board.id)  # fmt: skip
    for step in range(start + 1, args.steps + 1):
        time.sleep(args.step_s)
        if step > logged:
            mlflow.log_metric("step", step, step=step)
            board.log({"step": step})
        if rank == 0:
            emit("progress", step=step, total=args.steps)
            if step % args.checkpoint_every == 0:
                args.model_dir.mkdir(parents=True, exist_ok=True)
                (args.model_dir / "step.tmp").write_text(str(step))
                (args.model_dir / "step.tmp").replace(checkpoint)
    board.finish()
    mlflow.end_run()
    emit("done", rank=rank, step=args.steps, start_step=start, restart_count=attempt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
