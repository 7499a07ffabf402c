"""The progress watchdog: limit, suspects, records, and its one thread (no TensorFlow)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from slurmtf.errors import InputError
from slurmtf.training.flags import TrainConfig
from slurmtf.training.watchdog import (
    ProgressWatchdog,
    Record,
    WatchPolicy,
    from_config,
    read_records,
    suspects,
    write_record,
)

WORKERS = ("node1:12000", "node2:12001", "node3:12002")


@pytest.mark.parametrize(
    ("recent", "started", "expected"),
    [
        ((), True, 120.0),  # the floor
        ((0.05, 0.2, 0.1), True, 120.0),  # fast steps: still the floor
        ((3.0, 9.0), True, 180.0),  # slow steps: 20 x the slowest
        ((), False, 420.0),  # before the first step: plus the grace
        ((9.0,), False, 480.0),
    ],
)
def test_limit_is_the_floor_or_a_multiple_of_the_slowest_step(
    recent: tuple[float, ...], started: bool, expected: float
) -> None:
    assert WatchPolicy(floor=120, factor=20, first_step_grace=300).limit(
        recent, started
    ) == pytest.approx(expected)


def record(rank: int, step: int, phase: str, since: float, updated: float) -> Record:
    return Record(rank=rank, step=step, phase=phase, phase_since=since, updated=updated)


NOW = 1_000_000.0


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        # rank 1 stuck outside the collectives (a hung input pipeline)
        (
            {0: record(0, 10, "step", NOW - 60, NOW - 1), 1: record(1, 10, "host", NOW - 60, NOW)},
            ["rank 1 (node2:12001): in 'host' for 60 s at step 10"],
        ),
        # rank 2 silent: frozen (SIGSTOP), killed or unreachable
        (
            {
                0: record(0, 10, "step", NOW - 60, NOW),
                1: record(1, 10, "step", NOW - 60, NOW),
                2: record(2, 10, "step", NOW - 60, NOW - 40),
            },
            ["rank 2 (node3:12002): silent for 40 s at step 10"],
        ),
        # rank 0 behind the others; a rank without a record
        (
            {
                0: record(0, 8, "step", NOW - 5, NOW),
                1: record(1, 10, "step", NOW - 5, NOW),
                2: None,
            },
            ["rank 0 (node1:12000): behind, at step 8 of 10", "rank 2 (node3:12002): no progress"],
        ),
        # everyone waits in a collective, all fresh: nobody to blame
        ({0: record(0, 10, "step", NOW - 60, NOW), 1: record(1, 10, "eval", NOW - 60, NOW)}, []),
    ],
)
def test_suspects_name_the_stuck_rank_and_why(
    records: dict[int, Record | None], expected: list[str]
) -> None:
    found = suspects(records, NOW, limit=60, interval=5, workers=WORKERS)
    assert len(found) == len(expected), found
    for phrase, prefix in zip(found, expected, strict=True):
        assert phrase.startswith(prefix), (phrase, prefix)


def test_records_round_trip_atomically_and_bad_files_read_as_missing(tmp_path: Path) -> None:
    write_record(tmp_path, record(0, 3, "step", 1.0, 2.0))
    (tmp_path / "rank1.progress.json").write_text("{not json")
    records = read_records(tmp_path, 3)
    assert records[0] == record(0, 3, "step", 1.0, 2.0)
    assert records[1] is None
    assert records[2] is None
    assert not list(tmp_path.glob(".*tmp"))  # no temporary file left behind
    assert read_records(None, 2) == {0: None, 1: None}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_check_fires_only_after_the_limit_and_names_the_stuck_peer(tmp_path: Path) -> None:
    clock = FakeClock()
    wall = FakeClock()
    wall.now = NOW
    dog = ProgressWatchdog(
        rank=0,
        workers=WORKERS[:2],
        directory=str(tmp_path),
        policy=WatchPolicy(floor=10, factor=20, first_step_grace=30, interval=1),
        program="models.mnist",
        clock=clock,
        wall=wall,
    )
    for step in range(1, 4):  # three 0.1 s steps
        dog.enter("step", step - 1)
        clock.now += 0.1
        dog.finished(step)
    assert dog.limit == pytest.approx(10)  # 20 x 0.1 s < floor
    dog.enter("step", 3)
    write_record(tmp_path, record(1, 3, "host", NOW - 9, NOW))  # peer: out of the loop
    clock.now += 9.9
    assert dog.check() is None
    clock.now += 0.2
    wall.now += 1
    message = dog.check()
    assert message is not None
    assert message.startswith("models.mnist: no training step finished for 10 s on rank 0")
    assert "rank 1 (node2:12001): in 'host'" in message
    assert "--stall_timeout=10" in message
    assert "HINT:" in message
    with dog.paused():
        assert dog.check() is None  # long local work (export) holds no peer


def test_first_step_gets_the_grace(tmp_path: Path) -> None:
    clock = FakeClock()
    dog = ProgressWatchdog(
        rank=0,
        workers=WORKERS[:1],
        directory=None,
        policy=WatchPolicy(floor=10, factor=20, first_step_grace=30, interval=1),
        clock=clock,
    )
    clock.now = 39.0
    assert dog.check() is None
    clock.now = 41.0
    message = dog.check()
    assert message is not None
    assert "no shared log folder" in message


def test_the_thread_writes_records_and_reports_a_stall_once(tmp_path: Path) -> None:
    """The real thread with real time: one record file, one report, then it ends."""
    stalls: list[str] = []
    reported = threading.Event()

    def on_stall(message: str) -> None:
        stalls.append(message)
        reported.set()

    dog = ProgressWatchdog(
        rank=0,
        workers=WORKERS[:1],
        directory=str(tmp_path / "logs"),
        policy=WatchPolicy(floor=0.6, factor=1, first_step_grace=0, interval=0.1),
        on_stall=on_stall,
    ).start()
    try:
        dog.enter("step", 0)
        dog.finished(1)
        assert reported.wait(10), "the watchdog never fired"
        time.sleep(0.3)
        assert len(stalls) == 1
        saved = read_records(tmp_path / "logs", 1)[0]
        assert saved is not None
        assert saved.step == 1
        assert saved.phase == "host"
        assert threading.active_count() < 50
    finally:
        dog.stop()
    assert not any(t.name == "slurmtf-watchdog" for t in threading.enumerate())


def test_config_builds_the_watchdog_and_zero_turns_it_off() -> None:
    dog = from_config(TrainConfig(stall_timeout=60, stall_factor=5), 1, WORKERS, None, "m")
    assert dog is not None
    assert dog.policy.floor == 60
    assert dog.policy.factor == 5
    assert dog.policy.first_step_grace == 300  # the registration timeout
    assert from_config(TrainConfig(stall_timeout=0), 0, WORKERS, None, "m") is None


@pytest.mark.parametrize(("name", "value"), [("stall_timeout", -1.0), ("stall_factor", 0.5)])
def test_bad_watchdog_flags_are_named(name: str, value: float) -> None:
    with pytest.raises(InputError, match=rf"^--{name}={value}: .*HINT: "):
        TrainConfig(**{name: value})  # type: ignore[arg-type]
