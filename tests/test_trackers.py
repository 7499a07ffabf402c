"""The bundled models' scalars in MLflow and W&B (slurmtf.training.trackers), on fakes."""

from __future__ import annotations

import subprocess
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from slurmtf.errors import InputError
from slurmtf.training import trackers
from slurmtf.training.trackers import Trackers, wants_wandb


class FakeMlflow:
    """What the sender calls: ``MlflowClient().log_batch`` and ``end_run``."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.logged: list[tuple[str, str, float, int]] = []
        self.ended = 0
        self.fail_at = fail_at
        self.entities = SimpleNamespace(Metric=lambda k, v, t, s: (k, v, s))

    def MlflowClient(self) -> Any:
        def log_batch(run_id: str, metrics: list[tuple[str, float, int]]) -> None:
            for key, value, step in metrics:
                if step == self.fail_at:
                    raise ConnectionError("server gone")
                self.logged.append((run_id, key, value, step))

        return SimpleNamespace(log_batch=log_batch)

    def end_run(self) -> None:
        self.ended += 1


class FakeWandbRun:
    def __init__(self, step: int = 0) -> None:
        self.step = step
        self.logged: list[tuple[dict[str, float], int]] = []
        self.finished = False

    def log(self, values: dict[str, float], step: int) -> None:
        self.logged.append((values, step))
        self.step = step

    def finish(self) -> None:
        self.finished = True


def test_each_new_step_goes_to_both_trackers_named_by_split() -> None:
    mlflow, board = FakeMlflow(), FakeWandbRun()
    sink = Trackers((mlflow, "run-1"), board, last_logged=2)
    for step in range(1, 6):
        sink.log("train", step, {"loss": 1.0 / step})
    sink.log("eval", 5, {"accuracy": 0.5})
    sink.close()
    # MLflow: steps 1 and 2 were logged by an earlier start of the job.
    assert [(key, step) for _, key, _, step in mlflow.logged] == [
        ("train/loss", 3), ("train/loss", 4), ("train/loss", 5), ("eval/accuracy", 5)
    ]  # fmt: skip
    assert {run for run, *_ in mlflow.logged} == {"run-1"}
    assert [step for _, step in board.logged] == [1, 2, 3, 4, 5, 5]
    assert board.logged[-1][0] == {"eval/accuracy": 0.5}
    assert mlflow.ended == 1
    assert board.finished


def test_a_resumed_wandb_run_gets_no_step_below_its_own() -> None:
    board = FakeWandbRun(step=4)
    sink = Trackers(None, board)
    for step in (3, 4, 5):
        sink.log("train", step, {"loss": 0.1})
    sink.close()
    assert [step for _, step in board.logged] == [4, 5]


def test_a_failing_server_costs_a_warning_and_training_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    mlflow, board = FakeMlflow(fail_at=2), FakeWandbRun()
    sink = Trackers((mlflow, "r"), board)
    for step in (1, 2, 3):
        sink.log("train", step, {"loss": 0.1})  # never raises
    sink.close()
    assert [step for *_, step in mlflow.logged] == [1]  # nothing more after the failure
    assert [step for _, step in board.logged] == [1, 2, 3]


def test_a_slow_server_never_holds_a_step_and_the_overflow_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trackers, "QUEUED", 3)
    release = threading.Event()
    board = FakeWandbRun()
    slow = SimpleNamespace(step=0, finish=lambda: None, logged=board.logged)
    slow.log = lambda values, step: (release.wait(), board.log(values, step))
    sink = Trackers(None, slow)
    for step in range(1, 11):
        sink.log("train", step, {"loss": 0.1})  # returns at once although nothing is sent
    release.set()
    sink.close()
    sent = [step for _, step in board.logged]
    assert sent[0] == 1
    assert len(sent) <= 1 + 3  # one in flight, three queued, the rest dropped
    assert sent == sorted(sent)


def test_no_tracker_asked_for_is_no_thread_and_no_import() -> None:
    code = (
        "import sys, threading; from slurmtf.training.trackers import Trackers; "
        "env = {'SLURM_JOB_ID': '7', 'SLURM_PROCID': '0'}; "
        "t = Trackers.start(env, 0, True, {}); t.log('train', 1, {'loss': 1.0}); t.close(); "
        "print(t.active, 'mlflow' in sys.modules, 'wandb' in sys.modules, "
        "any(x.name == 'slurmtf-trackers' for x in threading.enumerate()))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False", "False", "False"]


def test_other_ranks_log_nothing_unless_every_rank_tracks() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "1", "WANDB_PROJECT": "p", "WANDB_MODE": "x"}
    assert not Trackers.start(dict(env), 1, False, {}).active


@pytest.mark.parametrize(
    ("env", "wanted"),
    [({}, False), ({"WANDB_PROJECT": "p"}, True), ({"SLURMTF_WANDB": "1"}, True),
     ({"WANDB_PROJECT": "p", "SLURMTF_WANDB": "0"}, False)],
)  # fmt: skip
def test_wandb_is_asked_for_by_its_project_or_by_slurmtf_wandb(
    env: dict[str, str], wanted: bool
) -> None:
    assert wants_wandb(env) is wanted


def test_a_bad_slurmtf_wandb_names_the_variable_and_the_value() -> None:
    with pytest.raises(InputError, match=r"SLURMTF_WANDB='yes'.*must be 1 or 0"):
        wants_wandb({"SLURMTF_WANDB": "yes"})


class DeadWandbRun:
    """A W&B run whose service process ended with the step (srun's SIGTERM to the step)."""

    @property
    def step(self) -> int:
        raise RuntimeError("MailboxClosedError")

    def finish(self) -> None:
        raise RuntimeError("MailboxClosedError")


def test_a_dead_wandb_service_leaves_mlflow_its_steps() -> None:
    mlflow = FakeMlflow()
    sink = Trackers((mlflow, "r"), DeadWandbRun())
    for step in (1, 2, 3):
        sink.log("train", step, {"loss": 0.1})
    sink.close()
    assert [step for *_, step in mlflow.logged] == [1, 2, 3]
    assert mlflow.ended == 1


def test_every_rank_tracking_keeps_another_ranks_keys_apart() -> None:
    mlflow = FakeMlflow()
    sink = Trackers((mlflow, "r"), None, prefix="rank1/")
    sink.log("train", 1, {"loss": 0.1})
    sink.close()
    assert [key for _, key, _, _ in mlflow.logged] == ["rank1/train/loss"]


# --- slurmtf.fit.TrackerLogger's hooks, on a fake model ------------------------------


class FakeModel:
    """What the hooks read: the strategy (no cluster: rank 0) and the optimizer's step."""

    def __init__(self) -> None:
        self.step = 0
        self.distribute_strategy = SimpleNamespace()
        self.optimizer = SimpleNamespace(iterations=SimpleNamespace(numpy=lambda: self.step))


def test_the_fit_logger_sends_every_nth_step_and_each_epochs_validation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slurmtf.fit import _LogToTrackers

    fake = FakeMlflow()
    monkeypatch.setattr(Trackers, "start", classmethod(lambda cls, *a: cls((fake, "r1"))))
    logger = _LogToTrackers(every=2)
    logger.model = FakeModel()
    logger.on_train_begin()
    for step in range(1, 6):
        logger.model.step = step
        logger.on_train_batch_end(step - 1, {"loss": step / 10, "note": "text"})
    logger.on_epoch_end(0, {"loss": 0.3, "val_loss": 0.4, "val_accuracy": 0.9})
    logger.on_train_end()
    assert [(k, s) for _, k, _, s in fake.logged] == [
        ("train/loss", 2), ("train/loss", 4), ("eval/loss", 5), ("eval/accuracy", 5),
    ]  # fmt: skip
    assert fake.ended == 1


def test_the_fit_logger_says_what_every_must_be() -> None:
    from slurmtf.fit import _LogToTrackers

    with pytest.raises(InputError, match="every"):
        _LogToTrackers(every=0)
