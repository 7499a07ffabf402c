"""The edge that asks the MLflow server for the job's run (:mod:`slurmtf.monitor.tracking`).

Called once per attempt by the process that starts the ranks (the job's supervisor, the
``--cluster=local`` runner, or, without either, the chief's own launcher). It imports
MLflow only when the job uses it (``SLURMTF_MLFLOW``, ``MLFLOW_TRACKING_URI``); a job
without a tracker never loads it. A server that cannot be asked costs a line in the log,
not the job: the chief's ``start_run()`` then makes a run of its own.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

from slurmtf.monitor.tracking import (
    JOB_TAG,
    LAST_STEP_ENV,
    RUN_ID_ENV,
    export_rank_env,
    job_key,
    run_name,
    wants_mlflow,
)

# MLflow's HTTP client retries a server that does not answer for about 4 minutes (7
# retries, backoff factor 2, measured): the look-up is bounded to seconds instead
# (retries 1 s and 2 s apart, 10 s per request), unless the job sets these itself.
BOUNDS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


def export_tracker_env(environ: MutableMapping[str, str], *, chief: bool, rank: int) -> None:
    """This rank's tracker variables into ``environ`` (before the user's script). Without a
    supervisor or local runner that found the job's MLflow run (SLURMTF_MLFLOW_RUN_ID,
    SLURMTF_MLFLOW_LAST_STEP), the chief asks itself."""
    if chief and RUN_ID_ENV not in environ:
        environ.update(job_run_env(environ, _to_stderr))
    export_rank_env(environ, chief=chief, rank=rank)


def _to_stderr(line: str) -> None:
    print(f"slurmtf: {line}", file=sys.stderr, flush=True)


def job_run_env(
    environ: Mapping[str, str], say: Callable[[str], None], client: Any = None
) -> dict[str, str]:
    """``SLURMTF_MLFLOW_RUN_ID`` (the job's run, found by its ``slurmtf.job`` tag or made)
    and ``SLURMTF_MLFLOW_LAST_STEP`` for the ranks; empty when the job does not use MLflow.
    ``client`` stands in for ``MlflowClient`` in tests."""
    key = job_key(environ)
    if key is None or not wants_mlflow(environ) or environ.get("MLFLOW_RUN_ID"):
        return {}  # outside Slurm, no MLflow, or the user named the run
    if client is None:
        if importlib.util.find_spec("mlflow") is None:
            say("MLFLOW_TRACKING_URI is set but mlflow is not installed here: no job run")
            return {}
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=environ.get("MLFLOW_TRACKING_URI") or None)
    try:
        with bounded(BOUNDS):
            run_id, last = find_or_create(client, environ, key)
    except Exception as exc:  # any failure of the server: the job goes on
        say(f"MLflow: cannot find or make the run of job {key} ({type(exc).__name__}: {exc})")
        return {}
    env = {RUN_ID_ENV: run_id}
    if last >= 0:
        env[LAST_STEP_ENV] = str(last)
    return env


@contextlib.contextmanager
def bounded(bounds: Mapping[str, str]) -> Iterator[None]:
    """``bounds`` in ``os.environ`` (where MLflow's client reads them) for the look-up
    only, each where the environment has none; as it was afterwards."""
    added = [name for name in bounds if name not in os.environ]
    os.environ.update({name: bounds[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def find_or_create(client: Any, environ: Mapping[str, str], key: str) -> tuple[str, int]:
    """The job's run id (the oldest run tagged ``slurmtf.job=<key>``, else a new one) and
    the highest step any of its metrics has (-1 when none)."""
    experiment = experiment_id(client, environ)
    runs = client.search_runs(
        [experiment], filter_string=f"tags.`{JOB_TAG}` = '{key}'",
        max_results=1, order_by=["attributes.start_time ASC"],
    )  # fmt: skip
    if not runs:
        made = client.create_run(experiment, tags={JOB_TAG: key}, run_name=run_name(environ, key))
        return str(made.info.run_id), -1
    run = runs[0]
    steps = [
        metric.step
        for name in run.data.metrics
        for metric in client.get_metric_history(run.info.run_id, name)
    ]
    return str(run.info.run_id), max(steps, default=-1)


def experiment_id(client: Any, environ: Mapping[str, str]) -> str:
    """``MLFLOW_EXPERIMENT_ID``, else ``MLFLOW_EXPERIMENT_NAME``'s (made when missing), else
    MLflow's default experiment ("0")."""
    if environ.get("MLFLOW_EXPERIMENT_ID"):
        return environ["MLFLOW_EXPERIMENT_ID"]
    name = environ.get("MLFLOW_EXPERIMENT_NAME")
    if not name:
        return "0"
    found = client.get_experiment_by_name(name)
    return str(found.experiment_id) if found is not None else str(client.create_experiment(name))
