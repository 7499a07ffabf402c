"""One tracker run per job: ids, each rank's environment, and the MLflow edge on a fake client."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from slurmtf.errors import InputError
from slurmtf.monitor import tracking
from slurmtf.monitor.tracker_runs import job_run_env

JOB = {"SLURM_JOB_ID": "1234", "SLURM_JOB_NAME": "train", "SLURM_PROCID": "0"}
ARRAY = {**JOB, "SLURM_JOB_ID": "1240", "SLURM_ARRAY_JOB_ID": "1234", "SLURM_ARRAY_TASK_ID": "6"}
URI = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000"}


@pytest.mark.parametrize(
    ("env", "key", "wandb"),
    [
        (JOB, "1234", "slurm-1234"),
        (ARRAY, "1234_6", "slurm-1234_6"),
        ({**JOB, "SLURM_RESTART_COUNT": "2"}, "1234", "slurm-1234"),  # a requeue: the same
        ({}, None, None),
    ],
)
def test_the_key_is_the_job_or_its_array_task(
    env: dict[str, str], key: str | None, wandb: str | None
) -> None:
    assert tracking.job_key(env) == key
    if key is not None:
        assert tracking.wandb_run_id(key) == wandb


def test_wandb_ids_keep_only_the_characters_wandb_takes() -> None:
    assert tracking.wandb_run_id("12.3/4:x") == "slurm-12-3-4-x"
    assert tracking.wandb_run_id("1234_6", rank=3) == "slurm-1234_6-rank3"


def test_the_chief_resumes_the_jobs_runs() -> None:
    env = tracking.rank_env({**JOB, **URI, tracking.RUN_ID_ENV: "abc"}, chief=True, rank=0)
    assert env["WANDB_RUN_ID"] == "slurm-1234"
    assert env["WANDB_RESUME"] == "allow"
    assert env["MLFLOW_RUN_ID"] == "abc"
    assert env["MLFLOW_TRACKING_URI"] == URI["MLFLOW_TRACKING_URI"]
    assert "WANDB_MODE" not in env


def test_other_ranks_log_nowhere_that_counts() -> None:
    given = {**JOB, **URI, tracking.RUN_ID_ENV: "abc", "MLFLOW_RUN_ID": "user"}
    env = tracking.rank_env(given, chief=False, rank=2, tmp="/scratch")
    assert env["WANDB_MODE"] == "disabled"
    assert "MLFLOW_RUN_ID" not in env
    assert env["MLFLOW_TRACKING_URI"] == "file:///scratch/slurmtf-mlruns-1234-rank2"
    assert env["MLFLOW_ALLOW_FILE_STORE"] == "true"
    assert given["MLFLOW_RUN_ID"] == "user"  # the input is left as it was


def test_other_ranks_of_a_job_without_mlflow_keep_their_mlflow_variables() -> None:
    env = tracking.rank_env(JOB, chief=False, rank=1)
    assert "MLFLOW_TRACKING_URI" not in env
    assert env["WANDB_MODE"] == "disabled"


def test_values_the_user_set_win_on_the_chief() -> None:
    mine = {"WANDB_RUN_ID": "mine", "WANDB_RESUME": "must", "MLFLOW_RUN_ID": "myrun"}
    env = tracking.rank_env({**JOB, **URI, **mine, tracking.RUN_ID_ENV: "abc"}, chief=True, rank=0)
    assert {k: env[k] for k in mine} == mine


def test_every_rank_logs_when_asked() -> None:
    given = {**ARRAY, **URI, tracking.RUN_ID_ENV: "abc", tracking.TRACK_ALL_ENV: "1"}
    env = tracking.rank_env(given, chief=False, rank=3)
    assert env["WANDB_RUN_ID"] == "slurm-1234_6-rank3"
    assert env["WANDB_RUN_GROUP"] == "slurm-1234_6"
    assert env["MLFLOW_RUN_ID"] == "abc"
    assert "WANDB_MODE" not in env


def test_outside_slurm_nothing_changes() -> None:
    assert tracking.rank_env(URI, chief=False, rank=1) == URI


def test_export_is_idempotent_and_removes_what_a_rank_must_not_have() -> None:
    environ = {**JOB, **URI, "MLFLOW_RUN_ID": "user"}
    tracking.export_rank_env(environ, chief=False, rank=1, tmp="/t")
    once = dict(environ)
    tracking.export_rank_env(environ, chief=False, rank=1, tmp="/t")
    assert environ == once
    assert "MLFLOW_RUN_ID" not in environ


@pytest.mark.parametrize(
    ("name", "value", "call"),
    [
        (tracking.TRACK_ALL_ENV, "yes", tracking.track_all),
        (tracking.MLFLOW_ENV, "on", tracking.wants_mlflow),
        (tracking.LAST_STEP_ENV, "ten", tracking.last_logged_step),
    ],
)
def test_bad_settings_name_the_variable_the_value_and_a_hint(
    name: str, value: str, call: Any
) -> None:
    with pytest.raises(InputError) as caught:
        call({name: value})
    text = str(caught.value)
    assert name in text
    assert repr(value) in text
    assert "HINT:" in text


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, False),
        (URI, True),
        ({**URI, "SLURMTF_MLFLOW": "0"}, False),
        ({"SLURMTF_MLFLOW": "1"}, True),
    ],
)
def test_mlflow_is_used_when_its_uri_is_set_or_asked(env: dict[str, str], wanted: bool) -> None:
    assert tracking.wants_mlflow(env) is wanted


@dataclass
class FakeRun:
    run_id: str
    metrics: dict[str, list[int]] = field(default_factory=dict)

    @property
    def info(self) -> Any:
        return self

    @property
    def data(self) -> Any:
        return self


@dataclass
class FakeClient:
    """MlflowClient's few calls the edge makes, over runs kept in a list."""

    runs: list[tuple[dict[str, str], FakeRun]] = field(default_factory=list)
    experiments: dict[str, str] = field(default_factory=dict)
    searched: list[tuple[list[str], str]] = field(default_factory=list)

    def search_runs(self, experiments: list[str], filter_string: str, **_: Any) -> list[FakeRun]:
        self.searched.append((experiments, filter_string))
        key = filter_string.split("'")[1]
        return [run for tags, run in self.runs if tags.get(tracking.JOB_TAG) == key]

    def create_run(self, experiment: str, tags: dict[str, str], run_name: str) -> FakeRun:
        run = FakeRun(f"run{len(self.runs)}")
        self.runs.append(({**tags, "name": run_name, "experiment": experiment}, run))
        return run

    def get_metric_history(self, run_id: str, key: str) -> list[Any]:
        run = next(r for _, r in self.runs if r.run_id == run_id)
        return [type("M", (), {"step": s})() for s in run.metrics[key]]

    def get_experiment_by_name(self, name: str) -> Any:
        found = self.experiments.get(name)
        return None if found is None else type("E", (), {"experiment_id": found})()

    def create_experiment(self, name: str) -> str:
        self.experiments[name] = str(len(self.experiments) + 1)
        return self.experiments[name]


def test_the_job_run_is_made_once_then_found_with_its_last_step() -> None:
    client = FakeClient()
    env = {**JOB, **URI, "MLFLOW_EXPERIMENT_NAME": "exp"}
    first = job_run_env(env, print, client)
    assert first == {tracking.RUN_ID_ENV: "run0"}
    tags, run = client.runs[0]
    assert tags == {tracking.JOB_TAG: "1234", "name": "train-1234", "experiment": "1"}
    run.metrics = {"loss": [0, 1, 2], "acc": [0, 5]}
    again = job_run_env({**env, "SLURM_RESTART_COUNT": "1"}, print, client)
    assert again == {tracking.RUN_ID_ENV: "run0", tracking.LAST_STEP_ENV: "5"}
    assert len(client.runs) == 1
    assert client.searched[-1] == (["1"], "tags.`slurmtf.job` = '1234'")


def test_no_mlflow_run_is_looked_for_without_mlflow_or_outside_slurm() -> None:
    client = FakeClient()
    assert job_run_env(JOB, print, client) == {}
    assert job_run_env(URI, print, client) == {}
    assert job_run_env({**JOB, **URI, "MLFLOW_RUN_ID": "mine"}, print, client) == {}
    assert client.searched == []


def test_a_server_that_fails_costs_a_line_not_the_job() -> None:
    said: list[str] = []

    class Down(FakeClient):
        def search_runs(self, *args: Any, **kwargs: Any) -> list[FakeRun]:
            raise ConnectionError("refused")

    assert job_run_env({**JOB, **URI}, said.append, Down()) == {}
    assert "refused" in said[0]
    assert "1234" in said[0]


def test_the_look_up_is_bounded_unless_the_job_set_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slurmtf.monitor.tracker_runs import BOUNDS, bounded

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")
    for name in BOUNDS:
        if name != "MLFLOW_HTTP_REQUEST_TIMEOUT":
            monkeypatch.delenv(name, raising=False)
    with bounded(BOUNDS):
        inside = {name: os.environ[name] for name in BOUNDS}
    assert inside == {**BOUNDS, "MLFLOW_HTTP_REQUEST_TIMEOUT": "60"}
    assert [name for name in BOUNDS if name in os.environ] == ["MLFLOW_HTTP_REQUEST_TIMEOUT"]


def test_a_job_without_trackers_imports_neither() -> None:
    code = (
        "import sys, slurmtf\n"
        "from slurmtf.runtime.rank import script, launcher\n"
        "from slurmtf.runtime.job import supervisor\n"
        "from slurmtf.monitor import tracker_runs\n"
        "env = {'SLURM_JOB_ID': '7', 'SLURM_PROCID': '0'}\n"
        "assert tracker_runs.job_run_env(env, print) == {}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'wandb')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def step_env(rank: int) -> dict[str, str]:
    """Rank ``rank`` of a 2-task step of job 1234 on this machine, with free ports."""
    from slurmtf.cluster.ports import free_port_base

    return {
        **JOB, "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
        "SLURM_NODEID": "0", "SLURMD_NODENAME": "localhost",
        "SLURMTF_PORT_BASE": str(free_port_base(2)),
        "MLFLOW_TRACKING_URI": "http://127.0.0.1:9", tracking.RUN_ID_ENV: "abc", "TMPDIR": "/t",
    }  # fmt: skip


@pytest.mark.parametrize("rank", [0, 1])
def test_the_submit_launcher_gives_its_child_the_ranks_variables(rank: int) -> None:
    from slurmtf.resolver import resolve
    from slurmtf.runtime.rank.launcher import child_environment

    environ = step_env(rank)
    env = child_environment(environ, resolve(environ))
    if rank == 0:
        assert (env["WANDB_RUN_ID"], env["MLFLOW_RUN_ID"]) == ("slurm-1234", "abc")
    else:
        assert env["WANDB_MODE"] == "disabled"
        assert env["MLFLOW_TRACKING_URI"] == "file:///t/slurmtf-mlruns-1234-rank1"
        assert "MLFLOW_RUN_ID" not in env


@pytest.mark.parametrize("rank", [0, 1])
def test_slurmtf_run_sets_the_ranks_variables_before_the_script(rank: int) -> None:
    from slurmtf.runtime.rank.script import prepare_task

    environ = step_env(rank)
    layout = prepare_task(environ)
    assert layout.is_chief is (rank == 0)
    assert "TF_CONFIG" in environ
    if rank == 0:
        assert (environ["WANDB_RESUME"], environ["MLFLOW_RUN_ID"]) == ("allow", "abc")
    else:
        assert environ["WANDB_MODE"] == "disabled"
        assert environ["MLFLOW_TRACKING_URI"].startswith("file:///t/")


def test_the_chief_of_a_parameter_server_job_resumes_the_jobs_runs() -> None:
    """``slurmtf serve -- COMMAND`` on the chief: the command gets the chief's variables."""
    from slurmtf.local.step import LocalStep, scrubbed_env

    step = LocalStep(nodes=("localhost",), tasks_per_node=3, job_id="1234")
    extra = {"SLURMTF_JOBS": "chief:1,ps:1,worker", "SLURMTF_PORT_BASE": "15100",
             "MLFLOW_TRACKING_URI": "http://127.0.0.1:9", tracking.RUN_ID_ENV: "abc"}  # fmt: skip
    env = scrubbed_env(extra=step.rank_env(0) | extra)
    show = "import os; print(os.environ['MLFLOW_RUN_ID'], os.environ['WANDB_RUN_ID'])"
    done = subprocess.run(
        [sys.executable, "-m", "slurmtf.serve", "--", sys.executable, "-c", show],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["abc", "slurm-1234"]
