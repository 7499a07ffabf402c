"""slurmtf.runtime.rank.teardown without TensorFlow: the order of leaving, with a recorded
context."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from slurmtf.runtime.rank import teardown

LEADER = "/job:worker/replica:0/task:0"
TASKS = [LEADER, "/job:worker/replica:0/task:1", "/job:worker/replica:0/task:2"]


class Exited(Exception):
    """Stands in for os._exit in these tests."""


class FakeContext:
    """Records the coordination-service calls; the barrier may fail."""

    def __init__(self, barrier_error: Exception | None = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.barrier_error = barrier_error

    def wait_at_barrier(self, barrier_id: str, timeout_ms: int) -> None:
        self.calls.append(("barrier", barrier_id, str(timeout_ms)))
        if self.barrier_error is not None:
            raise self.barrier_error

    def set_config_key_value(self, key: str, value: str) -> None:
        self.calls.append(("set", key, value))

    def get_config_key_value(self, key: str, timeout_ms: int) -> str:
        del timeout_ms
        self.calls.append(("get", key))
        return "1"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(task: str, barrier_error: Exception | None = None) -> FakeContext:
        ctx = FakeContext(barrier_error)
        monkeypatch.setitem(teardown._state, "left", False)
        monkeypatch.setattr(teardown, "_coordinated_task", lambda: (task, LEADER, TASKS))
        monkeypatch.setattr(teardown, "_context", lambda: ctx)
        monkeypatch.setattr(teardown, "_flush", lambda: ctx.calls.append(("flush",)))

        def exit_(code: int) -> None:
            ctx.calls.append(("exit", str(code)))
            raise Exited

        monkeypatch.setattr(teardown.os, "_exit", exit_)
        return ctx

    return make


def test_a_worker_waits_for_all_then_says_so_and_exits(fake: Any) -> None:
    ctx = fake(TASKS[2])
    with pytest.raises(Exited):
        teardown.leave_together(exit_code=75, timeout_s=5)
    assert ctx.calls == [
        ("barrier", teardown.BARRIER_ID, "5000"),
        ("flush",),
        ("set", teardown.LEFT_KEY + TASKS[2], "1"),
        ("exit", "75"),
    ]


def test_the_leader_leaves_after_every_worker_said_it_left(fake: Any) -> None:
    ctx = fake(LEADER)
    with pytest.raises(Exited):
        teardown.leave_together(exit_code=0)
    assert ctx.calls[1:] == [
        ("flush",),
        ("get", teardown.LEFT_KEY + TASKS[1]),
        ("get", teardown.LEFT_KEY + TASKS[2]),
        ("exit", "0"),
    ]


def test_without_an_exit_code_it_only_waits_and_only_once(fake: Any) -> None:
    ctx = fake(TASKS[1])
    assert teardown.leave_together() is True
    assert teardown.leave_together() is False  # idempotent: no second barrier
    assert ctx.calls == [("barrier", teardown.BARRIER_ID, "300000")]


def test_a_failed_barrier_warns_and_returns_without_exiting(fake: Any) -> None:
    ctx = fake(TASKS[1], RuntimeError("UNAVAILABLE: task 0 is gone\nmore"))
    assert teardown.leave_together(exit_code=0) is False
    assert [c[0] for c in ctx.calls] == ["barrier"]


def test_without_tensorflow_both_do_nothing_and_import_nothing() -> None:
    code = (
        "import sys; from slurmtf import teardown; teardown.prepare(); "
        "print(teardown.leave_together(exit_code=3), 'tensorflow' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]
