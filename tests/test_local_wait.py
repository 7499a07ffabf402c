"""--cluster=local's step: which failed rank it names first, as srun names the first task
that failed, with real processes standing in for the ranks' launchers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from slurmtf.local.job import exit_time, wait_ranks


def _rank(
    log: Path, code: int, *, after: float, says: float | None = None
) -> subprocess.Popen[bytes]:
    """A launcher that writes its ``exit`` event (at time ``says`` when given, else now)
    and ends with ``code`` after ``after`` seconds."""
    body = (
        "import json, sys, time\n"
        f"time.sleep({after})\n"
        f"when = {says!r} or round(time.time(), 3)\n"
        f"print(json.dumps({{'event': 'exit', 'status': {code}, 'time': when}}), flush=True)\n"
        f"sys.exit({code})\n"
    )
    with log.open("ab") as out:  # each in its own process group, as the runner starts ranks
        return subprocess.Popen([sys.executable, "-c", body], stdout=out, start_new_session=True)


def _ended_at(logs: list[Path]) -> Callable[[int], float | None]:
    return lambda rank: exit_time(logs[rank], 0)


def test_a_survivor_seen_first_is_named_after_the_rank_that_was_killed(tmp_path: Path) -> None:
    """Rank 0 (a survivor whose peer was lost) ends first in the runner's eyes; rank 1's
    launcher, whose child was killed, said it ended earlier but is reaped a moment later:
    srun would name rank 1, and so does the runner (status 137)."""
    logs = [tmp_path / f"rank{r}.out" for r in range(2)]
    killed_at = round(time.time(), 3)
    procs = [_rank(logs[0], 1, after=0.0), _rank(logs[1], 137, after=0.25, says=killed_at)]
    err = tmp_path / "srun.err"
    status = wait_ranks(procs, err, ended_at=_ended_at(logs))
    assert status == 137
    assert err.read_text().splitlines() == [
        "task 1: Exited with exit code 137",
        "task 0: Exited with exit code 1",
    ]


def test_a_killed_rank_is_named_at_once_and_stops_the_rest(tmp_path: Path) -> None:
    logs = [tmp_path / f"rank{r}.out" for r in range(3)]
    procs = [_rank(logs[0], 0, after=30), _rank(logs[1], 137, after=0), _rank(logs[2], 0, after=30)]
    err = tmp_path / "srun.err"
    started = time.monotonic()
    assert wait_ranks(procs, err, ended_at=_ended_at(logs)) == 137
    assert time.monotonic() - started < 10, "the others are stopped, not waited for"
    assert err.read_text().splitlines() == ["task 1: Exited with exit code 137"]
    assert all(p.returncode is not None for p in procs)


def test_failures_seen_at_one_look_are_named_by_when_they_ended(tmp_path: Path) -> None:
    logs = [tmp_path / f"rank{r}.out" for r in range(3)]
    now = time.time()
    procs = [
        _rank(logs[0], 3, after=0, says=now + 0.2),
        _rank(logs[1], 4, after=0, says=now + 0.1),
        _rank(logs[2], 5, after=0, says=now),
    ]
    time.sleep(1)  # all three ended before the first look
    err = tmp_path / "srun.err"
    assert wait_ranks(procs, err, ended_at=_ended_at(logs)) == 5
    assert [line.split(":")[0] for line in err.read_text().splitlines()] == [
        "task 2",
        "task 1",
        "task 0",
    ]


def test_exit_time_reads_only_this_attempts_ending(tmp_path: Path) -> None:
    log = tmp_path / "rank0.out"
    log.write_text(json.dumps({"event": "exit", "status": 137, "time": 10.5}) + "\nnoise\n")
    offset = log.stat().st_size
    assert exit_time(log, 0) == 10.5
    assert exit_time(log, offset) is None
    with log.open("a") as out:
        out.write(json.dumps({"event": "exit", "status": 1, "time": 12.0}) + "\n")
    assert exit_time(log, offset) == 12.0
    assert exit_time(tmp_path / "absent.out", 0) is None
