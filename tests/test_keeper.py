"""The keeper and the heartbeat (slurmtf/runtime/batch_host/keeper.py, heartbeat.py): a supervisor
that is killed, dies of an exception or stops beating is started again in place, told
how the one before ended; one that returns the job's status is not; SIGTERM is passed
on and ends the job; nothing it started is left behind. Real processes (fork), no Slurm.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slurmtf.runtime.batch_host.heartbeat import (
    PULSE,
    Beat,
    Heartbeat,
    beat_path,
    read_beat,
    write_beat,
)
from slurmtf.runtime.batch_host.keeper import Ending, Keeper
from slurmtf.runtime.job_log import stamp

BEAT_S = 0.25  # a forked supervisor under load may take a while to pulse
HOST = "node1"


def base(tmp_path: Path) -> tuple[Path, Beat]:
    return beat_path(tmp_path, "7"), Beat("7", HOST, 0, os.getpid(), 0, time.time())


def keep(
    tmp_path: Path,
    supervise: Callable[[int, Ending | None, int], int],
    limit: int = 3,
    beat_s: float = BEAT_S,
) -> tuple[int, list[Ending | None]]:
    """Run a keeper over ``supervise(pipe, previous, start)``; its status and the endings
    each start was told (read back from a file: each start is another process)."""
    told = tmp_path / "told"

    def run(pipe: int, previous: Ending | None) -> int:
        with told.open("a") as handle:
            handle.write(repr(previous) + "\n")
        return supervise(pipe, previous, len(told.read_text().splitlines()))

    path, beat = base(tmp_path)
    status = Keeper(run, path, beat, beat_s, limit).run()
    namespace = {"Ending": Ending, "None": None}
    return status, [eval(line, namespace) for line in told.read_text().splitlines()]


def pulse(pipe: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        os.write(pipe, PULSE)
        time.sleep(BEAT_S / 2)


def test_a_supervisor_that_returns_the_jobs_status_is_not_started_again(tmp_path: Path) -> None:
    status, told = keep(tmp_path, lambda pipe, _p, _n: (pulse(pipe, 0.2), 3)[1])
    assert (status, told) == (3, [None])


def test_a_killed_supervisor_is_started_again_and_told_how(tmp_path: Path) -> None:
    def supervise(pipe: int, _previous: Ending | None, start: int) -> int:
        pulse(pipe, 0.1)
        if start == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer's way
        return 0

    status, told = keep(tmp_path, supervise)
    assert status == 0
    first, second = told
    assert first is None
    assert second is not None
    assert (second.status, second.host, second.error, second.stuck) == (137, HOST, "", 0.0)
    assert (
        second.words() == f"was killed by SIGKILL (the OOM killer or kill -9) at {stamp(second.at)}"
    )
    assert second.who() == f"the supervisor (pid {second.pid} on node1)"
    beat = read_beat(beat_path(tmp_path, "7"))  # the keeper said so to the watcher
    assert beat is not None
    assert (beat.state, beat.pid) == ("restarting", second.pid)


def test_an_uncaught_exception_is_told_with_its_last_words(tmp_path: Path) -> None:
    def supervise(pipe: int, _previous: Ending | None, start: int) -> int:
        if start == 1:
            raise KeyError("ranks")
        return 5

    status, told = keep(tmp_path, supervise, beat_s=1.0)  # printing a traceback takes a while
    assert status == 5
    assert told[1] is not None
    assert told[1].error == "KeyError: 'ranks'"
    assert told[1].words().endswith(": KeyError: 'ranks'")
    assert told[1].words().startswith("died of an uncaught exception at 20")


def test_a_supervisor_that_stops_beating_is_killed_and_started_again(tmp_path: Path) -> None:
    def supervise(pipe: int, _previous: Ending | None, start: int) -> int:
        pulse(pipe, 0.1)
        if start == 1:
            os.kill(os.getpid(), signal.SIGSTOP)  # stopped alone: its keeper notices
        return 0

    started = time.monotonic()
    status, told = keep(tmp_path, supervise)
    assert status == 0
    assert told[1] is not None
    assert told[1].stuck >= 6 * BEAT_S  # STUCK_BEATS
    assert told[1].status == 128 + signal.SIGKILL
    assert told[1].words() == (f"stopped beating at {stamp(told[1].at)} (stopped or hung); "
                               f"its keeper killed it {told[1].stuck:.0f} s later")  # fmt: skip
    assert told[1].at < time.time() - told[1].stuck + 1  # the time of the last beat
    assert time.monotonic() - started < 10


def test_the_keeper_starts_a_supervisor_at_most_limit_times_more(tmp_path: Path) -> None:
    def supervise(_pipe: int, _previous: Ending | None, _start: int) -> int:
        raise RuntimeError("broken install")

    status, told = keep(tmp_path, supervise, limit=2, beat_s=1.0)
    assert status == 1
    assert len(told) == 3


def test_a_dead_supervisors_steps_are_ended_with_it(tmp_path: Path) -> None:
    """Its srun children (each in a session of its own) become the keeper's, which kills
    their process groups: here a child that ignores SIGTERM and its grandchild."""
    pids = tmp_path / "pids"

    def supervise(pipe: int, _previous: Ending | None, start: int) -> int:
        if start == 1:
            script = f"trap '' TERM; sleep 300 & echo $$ $! > {pids}; wait"
            subprocess.Popen(["bash", "-c", script], start_new_session=True)
            while not pids.exists() or not pids.read_text().strip():
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        return 0

    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)  # not its own
    try:
        assert keep(tmp_path, supervise)[0] == 0
        assert bystander.poll() is None  # a child the process had before: left alone
    finally:
        bystander.kill()
        bystander.wait()
    for pid in map(int, pids.read_text().split()):
        assert not alive(pid), pid


def test_sigterm_is_passed_on_and_ends_the_job(tmp_path: Path) -> None:
    """The job cancelled: the supervisor gets SIGTERM and its status is the job's; no
    supervisor is started again, even one that then dies without a status."""

    def supervise(pipe: int, _previous: Ending | None, _start: int) -> int:
        got: list[int] = []
        signal.signal(signal.SIGTERM, lambda s, _f: got.append(s))
        (tmp_path / "ready").touch()
        while not got:
            os.write(pipe, PULSE)
            time.sleep(BEAT_S / 2)
        os.kill(os.getpid(), signal.SIGKILL)  # dies before it says its status
        return 0

    def terminate() -> None:
        while not (tmp_path / "ready").exists():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate, daemon=True).start()
    before = signal.getsignal(signal.SIGTERM)
    status, told = keep(tmp_path, supervise)
    assert (status, len(told)) == (137, 1)
    assert signal.getsignal(signal.SIGTERM) is before  # the keeper's handlers are gone


def test_the_heartbeat_pulses_rewrites_one_line_and_ends_with_the_state(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    path, beat = base(tmp_path)
    state = ["running"]
    heart = Heartbeat(path, beat, 0.05, lambda: state[0], write_end)
    heart.start()
    time.sleep(0.5)
    first = None
    while first is None:  # a read may catch the file between its truncation and its write
        first = read_beat(path)
    state[0] = "ended"
    heart.stop()
    pulses = os.read(read_end, 4096)
    last = read_beat(path)
    assert first is not None
    assert last is not None
    assert first.state == "running"
    assert (last.state, last.host, last.job_id) == ("ended", HOST, "7")
    assert last.count > first.count >= 2
    assert len(pulses) == last.count
    assert set(pulses) == set(PULSE)
    assert len(path.read_text().splitlines()) == 1  # rewritten, never grown
    assert not heart.thread.is_alive()


def test_a_heartbeat_that_finds_another_write_stops_writing(tmp_path: Path) -> None:
    """A supervisor stopped while its watcher requeued the job (the job may run again
    elsewhere) finds the watcher's write when it wakes: it is usurped and writes no more."""
    path, beat = base(tmp_path)
    heart = Heartbeat(path, beat, 60, lambda: "running")
    heart.now()
    heart.now()  # its own writes
    assert not heart.usurped
    found = read_beat(path)
    assert found is not None
    write_beat(path, dataclasses.replace(found, count=found.count + 1, state="requeueing"))
    heart.now()
    assert heart.usurped
    again = read_beat(path)
    assert again is not None
    assert again.state == "requeueing"


@pytest.mark.parametrize(
    "text",
    ["", '{"job_id": "7", "host"', "[1, 2]", '{"job_id": "7"}',
     Beat("7", "n", 1, 2, 3, 4.0, "dancing").render()],
)  # fmt: skip
def test_a_half_written_or_foreign_heartbeat_is_no_beat(text: str) -> None:
    assert Beat.parse(text) is None


def test_a_beat_reads_back_as_written() -> None:
    beat = Beat("7", "node1", 11, 10, 4, 1795819574.5, "requeueing", 2)
    assert Beat.parse(beat.render()) == beat


def test_slurmtf_job_is_its_supervisors_keeper(tmp_path: Path) -> None:
    """``python -m slurmtf job`` as the job scripts exec it: two processes, the keeper
    (the one the script became) and the supervisor, its child; SIGKILL of the supervisor
    starts another, whose line in the job's log says how the first ended."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\necho $$ >> "$WORK/sruns"\nexec sleep 300\n')
    (bin_dir / "srun").chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parents[1]),
        "WORK": str(tmp_path), "LOG_DIR": str(tmp_path / "logs"), "MODEL_DIR": str(tmp_path),
        "SLURMTF_HEARTBEAT_S": "0.5", "MAX_RESTARTS": "1", "SLURMD_NODENAME": HOST,
    }  # fmt: skip
    command = [sys.executable, "-m", "slurmtf", "job", "command", "--", "train"]
    keeper = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        first = wait_for(functools.partial(supervisor_of, keeper.pid))
        titles = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in (keeper.pid, first)]
        expected = [b"slurmtf job command (keeper)", b"slurmtf job command (supervisor)"]
        assert [t.rstrip(b"\0") for t in titles] == expected
        wait_for((tmp_path / "sruns").exists)
        os.kill(first, signal.SIGKILL)
        second = wait_for(lambda: supervisor_of(keeper.pid) not in (None, first) and
                          supervisor_of(keeper.pid))  # fmt: skip
        wait_for(lambda: len((tmp_path / "sruns").read_text().split()) == 2)
        old_srun = int((tmp_path / "sruns").read_text().split()[0])
        assert not alive(old_srun)  # the first supervisor's step went with it
        keeper.send_signal(signal.SIGTERM)
        out, _ = keeper.communicate(timeout=30)
    finally:
        if keeper.poll() is None:
            keeper.kill()
    assert keeper.returncode == 128 + signal.SIGTERM, out
    said = f"the supervisor (pid {first} on node1) was killed by SIGKILL"
    assert re.search(
        rf"{re.escape(said)} \(the OOM killer or kill -9\) at \S+: the keeper starts it again", out
    ), out
    assert re.search(
        rf"restart 1 in place \(1 of 1 without progress, MAX_RESTARTS\), \d+\.\d s after "
        rf"{re.escape(said)}",
        out,
    )
    assert not alive(second)


def supervisor_of(keeper: int) -> int | None:
    """The keeper's child, the supervisor (by its title)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == keeper and b"(supervisor)" in cmdline:
            return int(entry.name)
    return None


def wait_for(found: Callable[[], object], timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return int(value) if not isinstance(value, bool) else 1
        time.sleep(0.05)
    raise TimeoutError(found)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
