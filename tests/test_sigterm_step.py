"""SIGTERM during a training step that still completes (Slurm's requeue, ``scancel``): the
step is reported, to the trackers too, before the rank saves it from memory and ends, so
that the next start, which resumes after it, leaves no step unlogged."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from slurmtf.training import phases
from slurmtf.training.phases import Training
from slurmtf.training.trackers import EXIT_WAIT_S

pytestmark = pytest.mark.tf  # train() builds its step inputs with TensorFlow


class Ended(Exception):
    """Stands in for the rank's end by SIGTERM."""


class Watcher:
    """SIGTERM arrives while step ``at`` runs."""

    def __init__(self, at: int, calls: list[str]) -> None:
        self.at, self.calls, self.terminating, self.requested = at, calls, False, False

    def end_if_terminating(self) -> None:
        self.calls.append("end")
        raise Ended


def _training(term_at: int, total: int = 6) -> tuple[Training, list[str]]:
    calls: list[str] = []
    watcher = Watcher(term_at, calls)
    state = SimpleNamespace(step=0)

    def train_step(iterator: Any, flag: Any, extra: Any) -> Any:
        state.step += 1
        if state.step == watcher.at:
            watcher.terminating = True  # the step completes all the same
        return SimpleNamespace(numpy=lambda: np.array([1.0 / state.step, 0.5, 0.0]))

    def rescue(step: int, rank: int) -> Any:
        calls.append(f"rescue {step}")
        return SimpleNamespace(step=step)

    class Summaries:
        def scalars(self, split: str, step: int, values: dict[str, float]) -> None:
            calls.append(f"{split} {step}")

        def close(self, wait_s: float = 10.0) -> None:
            calls.append(f"close {wait_s}")

    watch = SimpleNamespace(enter=lambda *a: None, finished=lambda *a, **k: None)
    training = Training(
        spec=None, config=SimpleNamespace(batch_size=8, log_every=1, checkpoint_every=0,
                                          stop_threshold=None),
        info=SimpleNamespace(rank=0, is_chief=True),
        strategy=SimpleNamespace(distribute_datasets_from_function=lambda fn: []),
        plan=SimpleNamespace(total=total, eval_every=1000), per_replica=8,
        watcher=watcher, watch=watch, model=None, schedule=lambda step: 0.1,
        step_var=SimpleNamespace(numpy=lambda: state.step),
        ckpt=SimpleNamespace(rescue=rescue), steps=SimpleNamespace(train_step=train_step),
        summaries=Summaries(), sync_state=lambda: None, restored=None, start=0,
        timing=SimpleNamespace(extra_input=lambda: [0.0], add=lambda *a: None),
    )  # type: ignore[arg-type]  # fmt: skip
    return training, calls


def test_a_step_that_completes_under_sigterm_is_logged_then_saved(monkeypatch: Any) -> None:
    monkeypatch.setattr(phases.events, "emit", lambda *a, **k: None)
    training, calls = _training(term_at=3)
    with pytest.raises(Ended):
        training.train()
    assert calls == ["train 1", "train 2", "train 3", "rescue 3", f"close {EXIT_WAIT_S}", "end"]
