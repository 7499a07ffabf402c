"""Warm ranks (slurmtf/runtime/job/warm.py, slurmtf/runtime/rank/standby.py): the next
attempt's step starts early, waits for its supervisor's word, and takes over.

The rank side runs in real processes that wait as a warm rank does; the supervisor's
side runs the real supervisor with a fake ``srun`` on PATH, whose ``--overlap`` step is
such a waiting process. No Slurm, no TensorFlow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slurmtf.errors import InputError
from slurmtf.runtime.job.children import Child
from slurmtf.runtime.job.settings import JobSettings, warm_mode
from slurmtf.runtime.job.supervisor import Supervisor
from slurmtf.runtime.job.warm import (
    AUTO_AFTER_S,
    START_AFTER_S,
    Standby,
    overlap_args,
    warm_delay,
    warm_now,
)
from slurmtf.runtime.rank import standby
from tests.test_supervisor import FakeRunner

# A warm rank: waits for the word, then says what it was told and exits 0.
WAITER = (
    "import os, sys\n"
    "from slurmtf.runtime.rank.standby import start_when_told\n"
    "went = start_when_told(os.environ)\n"
    "print('warm', 'went' if went else 'stopped', os.environ.get('SLURM_RESTART_COUNT'),"
    " os.environ.get('TOLD', '-'), 'SLURMTF_STANDBY' in os.environ, flush=True)\n"
)


def waiter_env(go: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, standby.STANDBY_ENV: str(go), **extra}


def test_a_waiting_rank_starts_with_the_env_it_is_given(tmp_path: Path) -> None:
    go = tmp_path / "go.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", WAITER], env=waiter_env(go, SLURM_RESTART_COUNT="1"),
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(0.3)
    assert proc.poll() is None, "the rank did not wait"
    standby.write_go(go, True, {"TOLD": "yes", "SLURM_RESTART_COUNT": "2"})
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert out.split() == ["warm", "went", "2", "yes", "False"], out


def test_a_rank_told_to_go_away_exits(tmp_path: Path) -> None:
    go = tmp_path / "go.json"
    standby.write_go(go, False)
    done = subprocess.run(
        [sys.executable, "-c", WAITER], env=waiter_env(go), capture_output=True, text=True,
        timeout=30, check=True,
    )  # fmt: skip
    assert done.stdout.split()[:2] == ["warm", "stopped"], done.stdout


@pytest.mark.parametrize(
    ("beat", "gone"),
    [
        ({"pid": 41, "state": "running"}, None),
        ({"pid": 41, "state": "restarting"}, None),
        ({"pid": 42, "state": "running"}, "another supervisor (pid 42) runs the job"),
        ({"pid": 41, "state": "ended"}, "the supervisor is ended"),
        ({"pid": 41, "state": "requeueing"}, "the supervisor is requeueing"),
        (None, None),  # not written yet: ask again
        ("{half", None),
    ],
)
def test_a_rank_stops_waiting_when_its_supervisor_is_gone(
    tmp_path: Path, beat: object, gone: str | None
) -> None:
    path = tmp_path / "supervisor-7.json"
    if isinstance(beat, dict):
        path.write_text(json.dumps(beat))
    elif isinstance(beat, str):
        path.write_text(beat)
    env = {standby.BEAT_ENV: str(path), standby.OF_ENV: "41"}
    assert standby.supervisor_gone(env) == gone


def test_a_rank_whose_supervisor_is_gone_does_not_wait_for_ever(tmp_path: Path) -> None:
    beat = tmp_path / "beat.json"
    beat.write_text(json.dumps({"pid": 99, "state": "running"}))
    env = {standby.STANDBY_ENV: str(tmp_path / "go"), standby.BEAT_ENV: str(beat),
           standby.OF_ENV: "41"}  # fmt: skip
    started = time.monotonic()
    assert standby.wait_for_go(env) is None
    assert time.monotonic() - started < 5


def test_a_rank_that_is_not_warm_starts_at_once() -> None:
    env: dict[str, str] = {}
    assert standby.start_when_told(env) is True
    assert env == {}


def test_what_a_warm_rank_writes_while_it_waits_stays_out_of_its_log(tmp_path: Path) -> None:
    """fd 2 goes to a side file while waiting, comes back after, and the file goes."""
    go = tmp_path / "go.json"
    code = (
        "import os, sys\n"
        "from slurmtf.runtime.rank.standby import quiet_stderr\n"
        "with quiet_stderr(os.environ):\n"
        "    os.write(2, b'start-up noise\\n')\n"
        "    print('python noise', file=sys.stderr)\n"
        "    assert os.path.exists(os.environ['SIDE'])\n"
        "os.write(2, b'the attempt\\n')\n"
    )
    side = tmp_path / "go.json.3.err"
    done = subprocess.run(
        [sys.executable, "-c", code], env=waiter_env(go, SLURM_PROCID="3", SIDE=str(side)),
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert done.stderr == "the attempt\n"
    assert not side.exists()


def test_the_word_is_written_whole(tmp_path: Path) -> None:
    go = tmp_path / "go.json"
    standby.write_go(go, True, {"A": "1"})
    assert standby.read_go(go) == {"go": True, "env": {"A": "1"}}
    assert [p.name for p in tmp_path.iterdir()] == ["go.json"]
    go.write_text('{"go": "yes"}')
    assert standby.read_go(go) is None


@pytest.mark.parametrize(
    ("mode", "failed", "delay"),
    [("0", True, None), ("1", False, 0.0), ("auto", True, 0.0), ("auto", False, AUTO_AFTER_S)],
)
def test_when_warm_ranks_start(mode: str, failed: bool, delay: float | None) -> None:
    assert warm_delay(mode, failed=failed) == delay


def test_warm_ranks_wait_for_the_chief_s_first_step_or_a_while() -> None:
    assert not warm_now(0.0, False, 1.0)
    assert warm_now(0.0, True, 1.0)
    assert warm_now(0.0, False, START_AFTER_S)
    assert not warm_now(AUTO_AFTER_S, True, AUTO_AFTER_S - 1)
    assert warm_now(AUTO_AFTER_S, True, AUTO_AFTER_S)


def test_a_bad_setting_names_the_variable() -> None:
    with pytest.raises(InputError, match=r"SLURMTF_WARM_STANDBY='yes': must be auto, 1 or 0"):
        warm_mode("yes")
    with pytest.raises(InputError, match="SLURMTF_WARM_STANDBY"):
        JobSettings.read("mnist", {"SLURMTF_WARM_STANDBY": "2"})
    assert JobSettings.read("mnist", {}).warm == "auto"


def test_the_warm_step_shares_the_allocation() -> None:
    assert overlap_args(["srun", "--nodes=2", "python3"]) == [
        "srun", "--overlap", "--open-mode=append", "--nodes=2", "python3",
    ]  # fmt: skip


def test_a_standby_that_is_not_needed_is_told_and_ends(tmp_path: Path) -> None:
    go = tmp_path / "standby-7.1.json"
    srun = tmp_path / "srun"  # drops srun's options, runs the waiting rank
    srun.write_text(f'#!/bin/bash\nexec {sys.executable} -c "$WAITER"\n')
    srun.chmod(0o755)
    warm = Standby.start(
        1, ["--nodes=2"], args=[str(srun), "--nodes=2"], env=waiter_env(go, WAITER=WAITER),
        go=go, stderr=None,
    )  # fmt: skip
    assert warm.fits(1, ["--nodes=2"])
    assert not warm.fits(2, ["--nodes=2"])
    assert not warm.fits(1, ["--nodes=1"])
    started = time.monotonic()
    assert warm.stop() == 0
    assert time.monotonic() - started < 3  # told, not ended by a signal
    assert not go.exists()
    assert not warm.fits(1, ["--nodes=2"])


# --- the supervisor with a fake srun -------------------------------------------------

WARM_SRUN = """#!/bin/bash
if [ -n "${SLURMTF_STANDBY:-}" ]; then  # the warm step: a waiting rank
    [ "$1" = "--overlap" ] || { echo "warm step without --overlap: $*" >&2; exit 3; }
    touch "$WARM_STARTED"
    exec "$PY" -c "$WAITER"
fi
if [ -e "$STEP_DONE" ]; then echo "step again: SLURM_RESTART_COUNT=$SLURM_RESTART_COUNT"; exit 0; fi
touch "$STEP_DONE"
echo '{"event": "trains", "rank": 0, "step": 1}' >> "${SLURMTF_NODE_EVENTS//%N/node1}"
if [ "${SLURMTF_WARM_STANDBY:-}" != 0 ]; then  # the warm step starts after the first step
    for i in $(seq 100); do [ -e "$WARM_STARTED" ] && break; sleep 0.05; done
fi
echo "srun: error: node2: task 1: Killed" >&2
exit 137
"""


def supervise_warm(tmp_path: Path, capfd: pytest.CaptureFixture[str], mode: str) -> tuple[int, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(WARM_SRUN)
    (bin_dir / "srun").chmod(0o755)
    environ = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "LOG_DIR": str(tmp_path / "logs"),
        "MODEL_DIR": str(tmp_path / "m"), "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_JOB_NUM_NODES": "2", "PYTHON": sys.executable, "PY": sys.executable,
        "PYTHONPATH": os.pathsep.join(sys.path), "WAITER": WAITER,
        "SLURMTF_NODE_WATCH_S": "0.05", "SLURMTF_WATCHER": "0", "SLURMTF_WARM_STANDBY": mode,
        "WARM_STARTED": str(tmp_path / "warm_started"), "STEP_DONE": str(tmp_path / "done"),
        "SLURMTF_REPO": str(Path(__file__).resolve().parents[1]),
    }  # fmt: skip
    job = JobSettings.read("mnist", environ)
    status = Supervisor(job, [], environ, FakeRunner()).run(header=False)
    captured = capfd.readouterr()
    return status, captured.out + captured.err


def test_the_warm_step_becomes_the_next_attempt(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """After the chief's first step the next attempt's ranks start (srun --overlap);
    the restart tells them to go instead of starting a new step."""
    status, out = supervise_warm(tmp_path, capfd, "1")
    assert status == 0, out
    assert "restart 1 in place" in out, out
    assert "warm ranks take over" in out, out
    assert "warm went 1 - False" in out, out  # the attempt's number, no longer warm
    assert "step again" not in out, out
    assert not list((tmp_path / "logs").glob("standby-*")), "a go file was left"


def test_without_warm_ranks_a_restart_starts_a_new_step(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    status, out = supervise_warm(tmp_path, capfd, "0")
    assert status == 0, out
    assert "step again: SLURM_RESTART_COUNT=1" in out, out
    assert "warm" not in out, out
    assert not (tmp_path / "warm_started").exists()


def test_a_warm_step_left_at_the_end_is_told_to_go(tmp_path: Path) -> None:
    """A job that ends while its warm ranks wait: they exit, and none is left."""
    go = tmp_path / "standby-7.2.json"
    child = Child([sys.executable, "-c", WAITER], waiter_env(go))
    warm = Standby(2, (), child, go)
    stopper = threading.Timer(0.5, warm.stop)
    stopper.start()
    child.proc.wait(timeout=30)
    stopper.join()
    assert child.status() == 0


def test_the_benchmarks_tell_a_waiting_warm_rank_from_a_training_one(tmp_path: Path) -> None:
    from benchmarks.harness import process_kind

    go = tmp_path / "standby-7.1.json"
    argv = [sys.executable.encode(), b"-m", b"models.mnist"]
    env = [b"SLURM_JOB_ID=7", b"SLURM_PROCID=1", f"SLURMTF_STANDBY={go}".encode()]
    assert process_kind("7", argv, env) == "warm1"
    standby.write_go(go, True)
    assert process_kind("7", argv, env) == "rank1"  # told to go: it trains now
    assert process_kind("7", argv, env[:2]) == "rank1"


def test_a_standby_for_another_placement_is_ended_at_once(tmp_path: Path) -> None:
    """A restart on other nodes does not wait for the warm step: it is told and ended."""
    go = tmp_path / "standby-7.3.json"
    child = Child(["sleep", "60"], dict(os.environ))  # a step that would not answer
    started = time.monotonic()
    assert Standby(3, (), child, go).stop(at_once=True) == 128 + 9
    assert time.monotonic() - started < 2
    # the word stays for ranks that have not read it yet (srun was killed before they
    # could leave): they leave when they do; the attempt's end removes it
    word = standby.read_go(go)
    assert word is not None
    assert word["go"] is False
