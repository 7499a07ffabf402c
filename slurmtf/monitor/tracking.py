"""One experiment-tracker run per job: the ids and the environment each rank gets.

A job is restarted in place (new srun steps) and requeued (same job id), and every start
runs the user's script again. Left alone, each start's ``mlflow.start_run()`` or
``wandb.init()`` makes a new run, on every rank. Here, as values only (no tracker is
imported):

* the job's key: ``<job id>``, or ``<array job id>_<task id>`` for an array task
  (:attr:`slurmtf.cluster.env.SlurmEnv.job_label`), the same at every start;
* W&B: the chief gets ``WANDB_RUN_ID=slurm-<key>`` and ``WANDB_RESUME=allow``, so every
  start's ``wandb.init()`` resumes one run; the other ranks get ``WANDB_MODE=disabled``;
* MLflow: the server picks run ids, so the process that starts the ranks finds the job's
  run by its tag ``slurmtf.job=<key>`` (or makes it: :mod:`slurmtf.monitor.tracker_runs`)
  and hands its id to the ranks as ``SLURMTF_MLFLOW_RUN_ID``; the chief gets it as
  ``MLFLOW_RUN_ID`` (``mlflow.start_run()`` then resumes that run); the other ranks get no
  run id and a tracking URI of their own throwaway local store (a ``file:`` store, with
  ``MLFLOW_ALLOW_FILE_STORE=true``, which MLflow 3.7+ asks for), so their ``start_run()``
  makes nothing on the server.

Values the user set win: a ``WANDB_RUN_ID``, ``WANDB_RESUME`` or ``MLFLOW_RUN_ID`` in the
job's environment is the chief's as it is. ``SLURMTF_TRACK_ALL_RANKS=1`` lets every rank
log: each other rank gets a W&B run of its own (``slurm-<key>-rank<N>``, grouped as
``slurm-<key>``) and the job's MLflow run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from slurmtf.cluster.env import read_slurm_env
from slurmtf.errors import InputError

TRACK_ALL_ENV = "SLURMTF_TRACK_ALL_RANKS"  # 1: every rank logs, not the chief alone
MLFLOW_ENV = "SLURMTF_MLFLOW"  # auto (with MLFLOW_TRACKING_URI), 1 (always), 0 (never)
RUN_ID_ENV = "SLURMTF_MLFLOW_RUN_ID"  # the job's MLflow run, found by the rank starter
LAST_STEP_ENV = "SLURMTF_MLFLOW_LAST_STEP"  # the highest step the job's run has logged
JOB_TAG = "slurmtf.job"  # the MLflow tag that names a run's job
_NOT_WANDB = re.compile(r"[^A-Za-z0-9_-]")  # W&B run ids: letters, digits, - and _


def job_key(environ: Mapping[str, str]) -> str | None:
    """The job's key (``<job id>`` or ``<array job>_<task>``); None outside Slurm."""
    label = read_slurm_env(environ).job_label
    return None if label == "local" else label


def wandb_run_id(key: str, rank: int | None = None) -> str:
    """``slurm-<key>`` (``-rank<N>`` for another rank's own run), in W&B's characters."""
    name = f"slurm-{key}" if rank is None else f"slurm-{key}-rank{rank}"
    return _NOT_WANDB.sub("-", name)


def run_name(environ: Mapping[str, str], key: str) -> str:
    """The MLflow run's name: the job's name and key (``train-1234``)."""
    return f"{environ.get('SLURM_JOB_NAME') or 'job'}-{key}"


def track_all(environ: Mapping[str, str]) -> bool:
    """``SLURMTF_TRACK_ALL_RANKS``: 1 lets every rank log, 0 (the default) the chief alone."""
    text = environ.get(TRACK_ALL_ENV, "") or "0"
    if text not in ("0", "1"):
        raise InputError(
            TRACK_ALL_ENV, text, "must be 1 or 0",
            f"leave it unset (the chief alone logs) or {TRACK_ALL_ENV}=1 (every rank logs)",
        )  # fmt: skip
    return text == "1"


def wants_mlflow(environ: Mapping[str, str]) -> bool:
    """Whether to find the job's MLflow run: ``SLURMTF_MLFLOW`` 1 (always), 0 (never), or
    auto (the default): when ``MLFLOW_TRACKING_URI`` is set."""
    hint = (
        "leave it unset (auto: when MLFLOW_TRACKING_URI is set), 1 to use MLflow's "
        "default store too, 0 to leave MLflow alone"
    )
    return auto_switch(environ, MLFLOW_ENV, "MLFLOW_TRACKING_URI", "must be auto, 1 or 0", hint)


def auto_switch(
    environ: Mapping[str, str], name: str, present: str, problem: str, hint: str
) -> bool:
    """``name``: 1 (on), 0 (off), or auto (unset): on when ``present`` is set."""
    text = (environ.get(name, "") or "auto").strip()
    if text not in ("auto", "0", "1"):
        raise InputError(name, text, problem, hint)
    return bool(environ.get(present)) if text == "auto" else text == "1"


def throwaway_store(tmp: str, key: str, rank: int) -> str:
    """A rank's own local MLflow store (a ``file:`` URI under ``tmp``)."""
    return (Path(tmp) / f"slurmtf-mlruns-{key}-rank{rank}").as_uri()


def rank_env(
    environ: Mapping[str, str], *, chief: bool, rank: int, tmp: str | None = None
) -> dict[str, str]:
    """``environ`` as this rank's tracker sees it (a new mapping; the input is unchanged).

    Outside Slurm the environment is left as it is. ``tmp`` (``TMPDIR``, else /tmp) holds
    the throwaway stores of the ranks that do not log to the server.
    """
    env = dict(environ)
    key = job_key(environ)
    if key is None:
        return env
    every = track_all(environ)
    if chief:
        env.setdefault("WANDB_RUN_ID", wandb_run_id(key))
        env.setdefault("WANDB_RESUME", "allow")
    elif every:
        env["WANDB_RUN_ID"] = wandb_run_id(key, rank)
        env.setdefault("WANDB_RUN_GROUP", wandb_run_id(key))
        env.setdefault("WANDB_RESUME", "allow")
    else:
        env["WANDB_MODE"] = "disabled"
    run_id = environ.get(RUN_ID_ENV, "")
    if chief or every:
        if run_id:
            env.setdefault("MLFLOW_RUN_ID", run_id)
    elif wants_mlflow(environ) or environ.get("MLFLOW_RUN_ID"):
        env.pop("MLFLOW_RUN_ID", None)
        where = tmp or environ.get("TMPDIR") or "/tmp"
        env["MLFLOW_TRACKING_URI"] = throwaway_store(where, key, rank)
        env.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.7+ refuses file: else
    return env


def export_rank_env(
    environ: MutableMapping[str, str], *, chief: bool, rank: int, tmp: str | None = None
) -> None:
    """Write :func:`rank_env`'s changes into ``environ`` (explicitly: ``os.environ`` before
    the user's script runs, or a child's environment)."""
    wanted = rank_env(environ, chief=chief, rank=rank, tmp=tmp)
    for name in [n for n in environ if n not in wanted]:
        del environ[name]
    for name, value in wanted.items():
        if environ.get(name) != value:
            environ[name] = value


def last_logged_step(environ: Mapping[str, str]) -> int:
    """The highest step the job's MLflow run had logged when this start began
    (``SLURMTF_MLFLOW_LAST_STEP``), -1 when none: a step at or below it was logged by
    an earlier start."""
    text = environ.get(LAST_STEP_ENV, "") or "-1"
    try:
        return int(text)
    except ValueError as exc:
        raise InputError(
            LAST_STEP_ENV, text, "is not a whole number",
            "leave it to slurmtf (it sets it for the chief when the job's run has metrics)",
        ) from exc  # fmt: skip
