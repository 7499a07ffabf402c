"""The one watch of a job's chief (no TensorFlow): started, blips, gone, never started."""

from __future__ import annotations

import pytest

from slurmtf.runtime.rank.chief_watch import Chief, ChiefNeverStarted, ChiefWatch


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_gone_after_two_misses_once_seen() -> None:
    answers = iter([False, True, True, False, True, False, False])
    clock = _Clock()
    watch = ChiefWatch(Chief("node1", 1), 60.0, probe=lambda h, p: next(answers), clock=clock)
    # not started yet, started, running, one blip, back, then gone for good
    assert [watch.gone() for _ in range(7)] == [False] * 6 + [True]
    assert watch.seen


def test_bounded_when_the_chief_never_answers() -> None:
    clock = _Clock()
    watch = ChiefWatch(Chief("node1", 7), 30.0, probe=lambda h, p: False, clock=clock)
    assert watch.gone() is False
    clock.now = 30.0
    with pytest.raises(
        ChiefNeverStarted, match=r"^the chief at node1:7 did not answer within 30 s$"
    ):
        watch.gone()


def test_the_probe_gets_the_chiefs_host_and_port() -> None:
    probed: list[tuple[str, int]] = []

    def probe(host: str, port: int) -> bool:
        probed.append((host, port))
        return True

    watch = ChiefWatch(Chief.at("node2:23100"), probe=probe)
    assert watch.gone() is False
    assert probed == [("node2", 23100)]
    assert str(watch.chief) == "node2:23100"
