"""The bundled models' scalars in the user's experiment trackers: MLflow and W&B.

Each rank gets its run as a user's script does (:mod:`slurmtf.monitor.tracking`: the
chief resumes the job's one run at every start; the other ranks log nowhere). Here the
training loop's ``train`` and ``eval`` scalars go to it as ``train/loss``,
``eval/accuracy``..., with the run's step:

* MLflow when the job asks for it (``MLFLOW_TRACKING_URI`` or ``SLURMTF_MLFLOW=1``, or
  an ``MLFLOW_RUN_ID``), W&B when ``WANDB_PROJECT`` is set or ``SLURMTF_WANDB=1``;
  neither package is imported otherwise;
* the chief alone, or every rank with ``SLURMTF_TRACK_ALL_RANKS=1`` (another rank's keys
  then begin ``rank<N>/``: the job's MLflow run is one for all; in W&B each rank has its
  own run, grouped);
* every step once across restarts and requeues: a step the job's MLflow run had logged
  before this start (``SLURMTF_MLFLOW_LAST_STEP``), or below W&B's resumed step, is
  skipped;
* the training flags as the run's parameters, at its first start.

A thread sends the scalars, so a slow server never holds a step; a rank that ends on a
failure or on SIGTERM (a requeue, ``scancel``) sends what it queued first (at most
:data:`EXIT_WAIT_S`), the step SIGTERM came in included. A SIGKILLed chief loses
what its thread had not sent yet: the resumed start does not redo those steps. A
tracker that is asked for but not installed, or that fails, costs a warning line, and
training goes on without it.
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from functools import partial
from typing import Any

from absl import logging

from slurmtf.monitor.tracker_runs import export_tracker_env
from slurmtf.monitor.tracking import auto_switch, last_logged_step, track_all, wants_mlflow

WANDB_ENV = "SLURMTF_WANDB"  # 1: log to W&B without WANDB_PROJECT; 0: never
QUEUED = 1000  # batches of scalars waiting for a slow server before new ones are dropped
CLOSE_WAIT_S = 10.0  # what the end of training waits for the queue to be sent
EXIT_WAIT_S = 5.0  # the same at the exit of a rank that failed (within srun's KillWait)


def wants_wandb(environ: Mapping[str, str]) -> bool:
    """``SLURMTF_WANDB`` 1 or 0; unset: when ``WANDB_PROJECT`` is set."""
    hint = (
        "leave it unset (W&B when WANDB_PROJECT is set), 1 for W&B's default project, "
        "0 to leave W&B alone"
    )
    return auto_switch(environ, WANDB_ENV, "WANDB_PROJECT", "must be 1 or 0", hint)


class Trackers:
    """The rank's open tracker runs. :meth:`log` queues scalars, and one thread
    (``slurmtf-trackers``) sends them, so a slow or dead server never holds a step; past
    :data:`QUEUED` batches waiting, the newest are dropped (a warning says so once)."""

    def __init__(
        self, mlflow: Any = None, wandb_run: Any = None, last_logged: int = -1, prefix: str = ""
    ) -> None:
        self._mlflow = mlflow  # (the mlflow module, the run's id) or None
        self._prefix = prefix  # another rank's keys in the job's one MLflow run: rank<N>/
        self._wandb = wandb_run
        self._last_logged = last_logged
        self._queue: queue.Queue[tuple[int, dict[str, float]] | None] = queue.Queue(QUEUED)
        self._dropped = False
        self._thread: threading.Thread | None = None
        if self.active:
            self._thread = threading.Thread(target=self._send, name="slurmtf-trackers", daemon=True)
            self._thread.start()
            # A rank that ends on a peer's failure sends what it queued, then exits.
            atexit.register(self.close, EXIT_WAIT_S)

    @property
    def active(self) -> bool:
        return self._mlflow is not None or self._wandb is not None

    @classmethod
    def start(
        cls, environ: MutableMapping[str, str], rank: int, is_chief: bool, params: Mapping[str, Any]
    ) -> Trackers:
        """The runs this rank logs to (none off the chief, unless every rank tracks). A
        bundled model's ranks start without slurmtf's rank launcher, so this rank's
        tracker variables go into ``environ`` here (the chief finds the job's MLflow run
        itself when no supervisor did)."""
        export_tracker_env(environ, chief=is_chief, rank=rank)
        if not (is_chief or track_all(environ)):
            return cls()
        asked = wants_mlflow(environ) or bool(environ.get("MLFLOW_RUN_ID"))
        mlflow = _start_mlflow(params) if asked else None
        wandb_run = _start_wandb(params) if wants_wandb(environ) else None
        prefix = "" if is_chief else f"rank{rank}/"
        return cls(mlflow, wandb_run, last_logged_step(environ), prefix)

    def log(self, split: str, step: int, values: Mapping[str, float]) -> None:
        """Queue ``values`` as ``<split>/<name>`` at ``step``."""
        if self._thread is None:
            return
        metrics = {f"{self._prefix}{split}/{name}": float(value) for name, value in values.items()}
        try:
            self._queue.put_nowait((step, metrics))
        except queue.Full:
            if not self._dropped:
                logging.warning("Trackers: %d batches wait for the server; dropping", QUEUED)
            self._dropped = True

    def close(self, timeout: float = CLOSE_WAIT_S) -> None:
        """Send what is queued (at most ``timeout`` seconds), then end the runs (each
        start resumes the job's run again)."""
        if self._thread is None:
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)
        self._thread = None
        if self._mlflow is not None:
            _quietly("MLflow", self._mlflow[0].end_run)
        if self._wandb is not None:
            _quietly("W&B", self._wandb.finish)
        self._mlflow = self._wandb = None

    def _send(self) -> None:
        while (item := self._queue.get()) is not None:
            self._send_one(*item)

    def _send_one(self, step: int, metrics: dict[str, float]) -> None:
        """MLflow first, then W&B; a tracker that fails (its process ended with the
        step, its server gone) gets nothing more, and the other goes on."""
        mlflow, wandb_run = self._mlflow, self._wandb
        to_mlflow = mlflow is not None and step > self._last_logged
        if to_mlflow and not _quietly("MLflow", partial(_mlflow_batch, mlflow, step, metrics)):
            self._mlflow = None
        to_wandb = partial(_wandb_log, wandb_run, step, metrics)
        if wandb_run is not None and not _quietly("W&B", to_wandb):
            self._wandb = None


def _wandb_log(run: Any, step: int, metrics: Mapping[str, float]) -> None:
    """Log at ``step`` unless the (resumed) run is past it already."""
    if step >= int(getattr(run, "step", 0) or 0):
        run.log(dict(metrics), step=step)


def _mlflow_batch(mlflow: tuple[Any, str], step: int, metrics: Mapping[str, float]) -> None:
    module, run_id = mlflow
    now = int(time.time() * 1000)
    batch = [module.entities.Metric(key, value, now, step) for key, value in metrics.items()]
    module.MlflowClient().log_batch(run_id, metrics=batch)


def _quietly(tracker: str, call: Callable[[], Any]) -> bool:
    """Run ``call``; a failure is a warning (the tracker then gets nothing more)."""
    try:
        call()
    except Exception as exc:  # a tracker's failure never ends training
        logging.warning("%s: %s; no more metrics go there", tracker, exc)
        return False
    return True


def _start_mlflow(params: Mapping[str, Any]) -> tuple[Any, str] | None:
    try:
        import mlflow
    except ImportError:
        logging.warning(
            "MLflow is asked for (MLFLOW_TRACKING_URI) but not installed: no metrics go "
            "there. HINT: pip install 'slurmtf[mlflow]', or unset MLFLOW_TRACKING_URI"
        )
        return None
    try:
        run = mlflow.start_run()  # the job's run: MLFLOW_RUN_ID, from the rank starter
        if not run.data.params:
            mlflow.log_params(dict(params))
    except Exception as exc:
        logging.warning("MLflow: %s; no metrics go there", exc)
        return None
    return mlflow, run.info.run_id


def _start_wandb(params: Mapping[str, Any]) -> Any:
    try:
        import wandb
    except ImportError:
        logging.warning(
            "W&B is asked for (WANDB_PROJECT or SLURMTF_WANDB=1) but not installed: no "
            "metrics go there. HINT: pip install 'slurmtf[wandb]', or unset WANDB_PROJECT"
        )
        return None
    try:
        return wandb.init(config=dict(params), allow_val_change=True)
    except Exception as exc:
        logging.warning("W&B: %s; no metrics go there", exc)
        return None
