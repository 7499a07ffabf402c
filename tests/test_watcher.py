"""The watcher (slurmtf/runtime/batch_host/watcher.py) and the supervisor's side of it
(batch_host/watcher_step.py, succession.py): a heartbeat that falls silent on a batch host that no
longer answers requeues the job at once without the host; a silent supervisor on a
host that answers is left to its keeper, then requeued; a job that ends, is cancelled,
is requeued or restarts its supervisor in place is left alone; the budget is kept. A
fake Slurm runner and clock; no Slurm, no TensorFlow."""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from slurmtf.errors import InputError, SlurmCommandError
from slurmtf.runtime import slurm_calls
from slurmtf.runtime.batch_host.heartbeat import Beat, beat_path, read_beat, write_beat
from slurmtf.runtime.batch_host.keeper import Ending
from slurmtf.runtime.batch_host.succession import after_keeper, after_slurm_requeue, take_over
from slurmtf.runtime.batch_host.watcher import Watcher, WatchSettings
from slurmtf.runtime.batch_host.watcher_step import WatcherPlace, watcher_args, watcher_place
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.runtime.job.supervisor import Supervisor
from slurmtf.runtime.recovery.decision import Budget, after_batch_host, after_supervisor
from slurmtf.runtime.recovery.record import batch_side_lines, read_record, restarts_so_far

BEAT_S = 5.0


class FakeSlurm:
    """srun probes of a node in ``dead`` fail; scontrol answers with ``state``; an
    update fails ``busy`` times with Slurm's "try again" first. Records every call."""

    def __init__(self, dead: Sequence[str] = (), state: str = "RUNNING", busy: int = 0) -> None:
        self.dead, self.state, self.busy = set(dead), state, busy
        self.calls: list[str] = []

    def __call__(self, args: Sequence[str], **_: Any) -> str:
        line = shlex.join(args)
        self.calls.append(line)
        probe = args[0] == "srun" or args[:2] == ["sh", "-c"]  # left running: an sh around it
        if probe and any(f"--nodelist={n}" in line for n in self.dead):
            raise SlurmCommandError(line, 1, "timed out")
        if args[:3] == ["scontrol", "show", "job"]:
            if not self.state:
                raise SlurmCommandError(line, 1, "Unable to contact slurm controller")
            return (
                f"JobId=7 JobName=x\n   JobState={self.state} Reason=None\n"
                "   ReqNodeList=node[1-2] ExcNodeList=(null)\n   NodeList=node[1-2]\n"
            )
        if args[:2] == ["scontrol", "update"] and self.busy:
            self.busy -= 1
            raise SlurmCommandError(line, 1, "Job update not available right now, the DB "
                                    "index is being set, try again in a bit for job 7")  # fmt: skip
        return ""

    def ran(self, head: str) -> list[str]:
        return [c for c in self.calls if c.startswith(head)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def settings(tmp_path: Path, **changes: Any) -> WatchSettings:
    (tmp_path / "job.out").touch()
    values: dict[str, Any] = {
        "job_id": "7", "log_dir": tmp_path, "host": "node1", "beat_s": BEAT_S, "budget": 3,
        "requeues": 0, "probe_s": 1.0, "job_log": tmp_path / "job.out",
    }  # fmt: skip
    values.update(changes)
    return WatchSettings(**values)


def beat(tmp_path: Path, count: int = 1, state: str = "running") -> None:
    write_beat(beat_path(tmp_path, "7"), Beat("7", "node1", 42, 41, count, 0.0, state))


def watch(tmp_path: Path, slurm: FakeSlurm, beats: int = 1, **changes: Any) -> tuple[int, float]:
    """The watcher over a heartbeat that wrote ``beats`` times, then fell silent; its
    status and the seconds (its clock) it watched."""
    clock = Clock()
    start = clock.now
    written = iter(range(1, beats + 1))

    def sleep(seconds: float) -> None:
        count = next(written, None)
        if count is not None:
            beat(tmp_path, count)
        clock.sleep(seconds)

    watcher = Watcher(settings(tmp_path, **changes), slurm, clock=clock, sleep=sleep)
    return watcher.run(), clock.now - start


def test_a_lost_batch_host_requeues_the_job_at_once_without_it(tmp_path: Path) -> None:
    beat(tmp_path)
    slurm = FakeSlurm(dead=["node1"], busy=2)
    status, watched = watch(tmp_path, slurm, beats=3)
    assert status == 0
    assert watched == 3 * BEAT_S + 3 * BEAT_S  # news for 3 beats, then 3 silent ones
    probes = slurm.ran("srun")
    assert len(probes) == 1
    assert "--nodelist=node1" in probes[0]
    assert slurm.ran("scontrol requeue") == ["scontrol requeue 7"]
    updates = slurm.ran("scontrol update")
    assert updates[-2:] == ["scontrol update JobId=7 ExcNodeList=node1",
                            "scontrol update JobId=7 ReqNodeList=node2"]  # fmt: skip
    assert len(updates) == 4  # the first update was tried again twice ("try again")
    (record,) = read_record(tmp_path, "7")
    assert (record["kind"], record["action"], record["host"]) == ("batch_host", "requeue", "node1")
    assert record["exclude"] == ["node1"]
    line = record["line"]
    assert line.startswith("batch host node1 lost at ")
    assert (
        "(the supervisor's last heartbeat; node1 does not answer a probe): requeueing job 7 "
        "(restart 1, 1 of 3 without progress, MAX_RESTARTS) at " in line
    )
    assert line.endswith(" without node1")
    assert line in (tmp_path / "job.out").read_text()
    assert (
        "Slurm holds job 7 (COMPLETING, then PENDING) until it gives node1 up, about "
        "SlurmdTimeout (300 s) after node1's last answer" in (tmp_path / "job.out").read_text()
    )
    assert batch_side_lines(read_record(tmp_path, "7")) == [line]
    assert restarts_so_far(read_record(tmp_path, "7"), 1) == 1  # Slurm's count agrees
    written = read_beat(beat_path(tmp_path, "7"))
    assert written is not None
    assert written.state == "requeueing"  # the job's next start knows it was said


@pytest.mark.parametrize("state", ["requeueing", "stopping", "ended"])
def test_a_job_that_ends_or_goes_back_to_the_queue_is_left_alone(
    tmp_path: Path, state: str
) -> None:
    beat(tmp_path, state=state)
    slurm = FakeSlurm(dead=["node1"])
    assert watch(tmp_path, slurm, beats=0)[0] == 0
    assert slurm.calls == ["scontrol show config"]  # its kill timers, once at the start


def test_a_supervisor_restarting_in_place_is_news_not_silence(tmp_path: Path) -> None:
    """Its keeper writes ``restarting``, the new supervisor beats: no probe, no requeue."""
    beat(tmp_path)
    slurm = FakeSlurm(dead=["node1"])
    clock = Clock()
    states = iter(["restarting", *["running"] * 20])

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        count = int(clock.now)
        state = next(states, None)
        if state is None:
            beat(tmp_path, count, "ended")
        else:
            beat(tmp_path, count, state)

    assert Watcher(settings(tmp_path), slurm, clock=clock, sleep=sleep).run() == 0
    assert slurm.calls == ["scontrol show config"]  # its kill timers, once at the start


def test_a_silent_supervisor_on_a_host_that_answers_is_left_to_its_keeper_then_requeued(
    tmp_path: Path,
) -> None:
    beat(tmp_path)
    slurm = FakeSlurm()
    assert watch(tmp_path, slurm)[1] == 12 * BEAT_S  # GIVE_UP_BEATS of silence
    assert len(slurm.ran("srun")) == 10  # a probe a beat from the 3rd silent one
    assert slurm.ran("scontrol requeue") == ["scontrol requeue 7"]
    said = (tmp_path / "job.out").read_text()
    assert (
        "the supervisor on node1 has not beaten for 15 s, but node1 answers: its keeper "
        "ends a supervisor silent for 30 s and starts it again" in said
    )
    assert said.count("has not beaten") == 1
    (record,) = read_record(tmp_path, "7")
    assert "while node1 answers (neither it nor its keeper recovered)" in record["line"]


def test_with_the_budget_spent_the_job_is_cancelled_not_left_holding_its_nodes(
    tmp_path: Path,
) -> None:
    beat(tmp_path)
    slurm = FakeSlurm(dead=["node1"])
    assert watch(tmp_path, slurm, requeues=2, budget=2)[0] == 0
    assert slurm.ran("scontrol requeue") == []
    assert slurm.ran("scancel") == ["scancel 7"]
    (record,) = read_record(tmp_path, "7")
    assert record["action"] == "stop"
    assert (
        "not restarted: already restarted 2 time(s) in a row without progress (MAX_RESTARTS=2); "
        "cancelling job 7" in record["line"]
    )


def test_a_job_slurm_no_longer_runs_is_left_alone(tmp_path: Path) -> None:
    beat(tmp_path)
    slurm = FakeSlurm(dead=["node1"], state="COMPLETING")
    assert watch(tmp_path, slurm)[0] == 0
    assert slurm.ran("scontrol requeue") == slurm.ran("scancel") == []
    assert read_record(tmp_path, "7") == []


def test_a_controller_that_does_not_answer_is_asked_again(tmp_path: Path) -> None:
    beat(tmp_path)
    slurm = FakeSlurm(dead=["node1"], state="")
    clock = Clock()
    asked: list[float] = []

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        asked.append(clock.now)
        if len(asked) == 8:
            slurm.state = "RUNNING"

    assert Watcher(settings(tmp_path), slurm, clock=clock, sleep=sleep).run() == 0
    assert len(slurm.ran("scontrol show job")) >= 5
    assert slurm.ran("scontrol requeue") == ["scontrol requeue 7"]


def test_a_heterogeneous_jobs_batch_host_is_probed_in_its_component(tmp_path: Path) -> None:
    beat(tmp_path)
    slurm = FakeSlurm(dead=["node1"])
    status, _ = watch(tmp_path, slurm, host_group=0)
    assert status == 0
    probes = slurm.ran("sh -c")  # left running at its timeout (slurm_calls.left_running)
    assert len(probes) == 1, slurm.calls
    assert not slurm.ran("srun"), slurm.calls
    assert "--het-group=0" in probes[0]
    assert "--nodelist=node1" in probes[0]
    assert "exit 124" in probes[0]
    assert slurm.ran("scontrol requeue") == ["scontrol requeue 7"]


def job(tmp_path: Path, **env: str) -> JobSettings:
    return JobSettings.read("mnist", {
        "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_JOB_NUM_NODES": "3",
        "SLURMD_NODENAME": "node1", "LOG_DIR": str(tmp_path), "MODEL_DIR": str(tmp_path),
        "MAX_RESTARTS": "3", **env,
    })  # fmt: skip


@pytest.mark.parametrize(
    ("env", "left_out", "place"),
    [
        ({}, (), WatcherPlace("node3")),
        ({}, ("node3",), WatcherPlace("node2")),
        ({}, ("node2", "node3"), None),
        ({"SLURM_JOB_NODELIST": "node1", "SLURM_JOB_NUM_NODES": "1"}, (), None),
        ({"SLURMD_NODENAME": "node3"}, (), WatcherPlace("node2")),
        ({"SLURM_JOB_NODELIST": "node1", "SLURM_HET_SIZE": "2",
          "SLURM_JOB_NODELIST_HET_GROUP_0": "node1",
          "SLURM_JOB_NODELIST_HET_GROUP_1": "node[2-3]"}, (), WatcherPlace("node3", 1)),
    ],
)  # fmt: skip
def test_the_watcher_runs_on_the_last_node_that_is_not_the_batch_host(
    tmp_path: Path, env: dict[str, str], left_out: tuple[str, ...], place: WatcherPlace | None
) -> None:
    settings = job(tmp_path, **env)
    assert watcher_place(settings, settings.slurm.nodename or "", left_out) == place


def test_the_watcher_step_shares_the_jobs_resources_and_is_named(tmp_path: Path) -> None:
    settings = job(tmp_path, SLURMTF_HEARTBEAT_S="2", SLURM_RESTART_COUNT="1")
    args = watcher_args(settings, WatcherPlace("node3", 1), "node1", tmp_path / "job.out")
    assert args[:7] == ["srun", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=node3",
                        "--het-group=1", "--job-name=slurmtf-watcher"]  # fmt: skip
    assert f"--output={tmp_path}/watcher-7.out" in args
    at = args.index(sys.executable)
    assert args[at : at + 4] == [sys.executable, "-m", "slurmtf.cli", "watcher"]
    assert args[at + 4:] == [
        "--job_id=7", f"--log_dir={tmp_path}", "--host=node1", "--heartbeat_s=2",
        "--max_restarts=3", "--restart_budget=progress",
        "--max_failures_per_hour=0", "--requeues=1", "--probe_s=10",
        f"--job_log={tmp_path}/job.out",
    ]  # fmt: skip


def test_a_restarted_supervisor_records_what_the_one_before_cost(tmp_path: Path) -> None:
    """It ends the steps the one before left (its watcher's too), then records the
    restart with where each rank's error log ended (what came before is recovered)."""
    cancelled = "slurmstepd: error: *** STEP 7.0 CANCELLED ***\n"
    (tmp_path / "rank0.err").write_text(cancelled)
    slurm = FakeSlurm()
    ending = Ending(4242, "node1", 1795819574.0, 137)
    assert take_over(job(tmp_path, SLURM_RESTART_COUNT="1"), ending, None, slurm) is None
    assert slurm.ran("squeue")[0] == "squeue -h -s -j 7 -o '%i %j'"
    (record,) = read_record(tmp_path, "7")
    assert (record["kind"], record["action"], record["host"]) == ("supervisor", "restart", "node1")
    assert record["ends"] == {"0": len(cancelled)}
    line = record["line"]
    assert line.startswith("restart 2 in place (2 of 3 without progress, MAX_RESTARTS), ")
    assert (
        "s after the supervisor (pid 4242 on node1) was killed by SIGKILL (the OOM killer "
        "or kill -9) at 20" in line
    )
    assert restarts_so_far(read_record(tmp_path, "7"), 1) == 2
    spent = job(tmp_path, SLURM_RESTART_COUNT="1", MAX_RESTARTS="2")
    decision, line = after_keeper(spent, ending, Budget(2, 2, "progress"))
    assert decision.action == "stop"
    assert (
        "not restarted: already restarted 2 time(s) in a row without progress (MAX_RESTARTS=2)"
        in line
    )
    assert take_over(spent, ending, None, FakeSlurm()) == 1


def test_a_requeue_slurm_made_while_the_supervisor_ran_is_said_once(tmp_path: Path) -> None:
    """A one-node job whose node failed: Slurm requeued it (the heartbeat still says
    running); the next start says so, with the last beat's time, and records it."""
    old = Beat("7", "node3", 42, 41, 9, 1795819574.0)
    assert after_slurm_requeue(job(tmp_path), old) == ""  # the first start: nothing to say
    assert after_slurm_requeue(job(tmp_path, SLURM_RESTART_COUNT="1"), None) == ""
    line = after_slurm_requeue(job(tmp_path, SLURM_RESTART_COUNT="1"), old)
    assert line.startswith("Slurm requeued job 7 while its supervisor (pid 42 on node3) still "
                           "ran (its last heartbeat at 20")  # fmt: skip
    assert "): the batch host node3 was lost; started again at " in line
    assert line.endswith(" on node1 (restart 1 of 3, MAX_RESTARTS)")
    records = read_record(tmp_path, "7")
    assert [r["kind"] for r in records] == ["batch_host"]
    assert restarts_so_far(records, 1) == 1
    assert after_slurm_requeue(job(tmp_path, SLURM_RESTART_COUNT="1"), old) == ""  # said once
    ours = dataclasses.replace(old, state="requeueing")  # the watcher's requeue: recorded
    assert after_slurm_requeue(job(tmp_path, SLURM_RESTART_COUNT="2"), ours) == ""


def test_the_decisions_of_the_batch_side() -> None:
    killed = after_supervisor("the supervisor (pid 1) was killed by SIGKILL", Budget(1, 3))
    assert (killed.action, killed.restart, killed.exclude) == ("restart", 2, ())
    lost = after_batch_host("batch host node1 lost", "node1", Budget(0, 3))
    assert (lost.action, lost.exclude, lost.restart) == ("requeue", ("node1",), 1)
    assert (
        lost.line("7")
        == "batch host node1 lost: requeueing job 7 (restart 1, 1 of 3 without progress, "
        "MAX_RESTARTS)"
    )
    spent = after_batch_host("batch host node1 lost", "node1", Budget(3, 3))
    assert (spent.action, spent.status) == ("stop", 1)


def test_the_steps_of_the_job_are_ended_but_the_watchers(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def runner(args: Sequence[str], **_: Any) -> str:
        calls.append(list(args))
        if args[0] == "squeue":
            return "7.0 mnist\n7.1 slurmtf-watcher\n7.batch batch\n7.extern extern\n"
        return ""

    waited: list[float] = []
    assert slurm_calls.end_steps("7", runner, grace_s=0.05, sleep=waited.append) == ["7.0"]
    scancels = [c for c in calls if c[0] == "scancel"]
    assert scancels == [["scancel", "--ctld", "--signal=TERM", "7.0"], ["scancel", "7.0"]]
    assert waited, "the step that stays listed is given its grace before SIGKILL"
    calls.clear()
    ended = slurm_calls.end_steps("7", runner, watcher_too=True, grace_s=0, sleep=waited.append)
    assert ended == ["7.0", "7.1"]
    assert [c for c in calls if c[0] == "scancel"][-1] == ["scancel", "7.0", "7.1"]


def test_steps_whose_tasks_left_on_sigterm_are_not_waited_for() -> None:
    calls: list[list[str]] = []

    def runner(args: Sequence[str], **_: Any) -> str:
        calls.append(list(args))
        termed = ["scancel", "--ctld", "--signal=TERM", "7.0"] in calls
        return "" if termed or args[0] != "squeue" else "7.0 mnist\n"

    waited: list[float] = []
    assert slurm_calls.end_steps("7", runner, grace_s=30, sleep=waited.append) == ["7.0"]
    assert waited == []


def test_the_record_of_the_batch_side_reads_as_json_lines(tmp_path: Path) -> None:
    beat(tmp_path)
    watch(tmp_path, FakeSlurm(dead=["node1"]))
    text = (tmp_path / "recovery-7.jsonl").read_text()
    assert [json.loads(line)["kind"] for line in text.splitlines()] == ["batch_host"]


FAKE_SRUN = """#!/bin/bash
if [[ " $* " == *" --job-name=slurmtf-watcher "* ]]; then
    echo "$$ $*" > "$WORK/watcher"
    exec sleep 300
fi
sleep 0.5
exit 0
"""


def test_the_supervisor_starts_its_watcher_on_another_node_and_ends_it(tmp_path: Path) -> None:
    """The real supervisor with a fake srun: the watcher step on node2 (not the batch
    host), ended with the job; the heartbeat's last word is ``ended``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    environ = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "WORK": str(tmp_path), "LOG_DIR": str(tmp_path),
        "MODEL_DIR": str(tmp_path / "m"), "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_JOB_NUM_NODES": "2", "SLURMD_NODENAME": "node1", "PYTHON": sys.executable,
        "SLURMTF_NODE_WATCH_S": "0.05",
    }  # fmt: skip
    settings = JobSettings.read("command", environ)
    status = Supervisor(settings, ["train"], environ, FakeSlurm()).run(header=False)
    assert status == 0
    pid, *args = (tmp_path / "watcher").read_text().split()
    assert "--nodelist=node2" in args
    assert "--host=node1" in args
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    beat = read_beat(beat_path(tmp_path, "7"))
    assert beat is not None
    assert (beat.state, beat.host, beat.job_id) == ("ended", "node1", "7")


def test_the_watcher_refuses_to_run_without_its_job() -> None:
    from slurmtf.cli import watcher as cli

    assert cli.main(["--job_id=7", "--host=node1"]) == 2


WARNED_WATCHER = """
import os, signal, sys
from slurmtf.cli import watcher as cli

def warned(self):  # Slurm's warning before the time limit, while the watcher watches
    os.kill(os.getpid(), signal.SIGUSR2)
    print("still watching", flush=True)
    return 0

cli.Watcher.run = warned
sys.exit(cli.main(["--job_id=7", "--host=node1", f"--log_dir={sys.argv[1]}"]))
"""


def test_the_watcher_outlives_slurms_warning_signal(tmp_path: Path) -> None:
    """``--signal=USR2@S`` reaches every step of the job, the watcher's too: it must go on
    watching the batch host, not die of the signal's default action."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", WARNED_WATCHER, str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "still watching\n"), done.stderr


def test_the_watcher_setting_is_one_or_zero(tmp_path: Path) -> None:
    assert job(tmp_path).watcher is True
    assert job(tmp_path, SLURMTF_WATCHER="0").watcher is False
    with pytest.raises(InputError, match=r"SLURMTF_WATCHER='no': must be 1 or 0. HINT: leave"):
        job(tmp_path, SLURMTF_WATCHER="no")
    with pytest.raises(InputError, match=r"SLURMTF_HEARTBEAT_S='-1': is not a number of seconds"):
        job(tmp_path, SLURMTF_HEARTBEAT_S="-1")


class StepsSlurm(FakeSlurm):
    """Also lists the job's steps (the training step, the watcher's, the batch step) and
    a 22.05 configuration whose kill timers can lose the race."""

    CONFIG = ("SLURM_VERSION           = 22.05.8\nKillWait                = 5 sec\n"
              "MessageTimeout          = 30 sec\nUnkillableStepTimeout   = 60 sec\n")  # fmt: skip

    def __call__(self, args: Sequence[str], **kwargs: Any) -> str:
        if args[0] == "squeue":  # the training step leaves once its tasks got SIGTERM
            self.calls.append(shlex.join(args))
            termed = "scancel --ctld --signal=TERM 7.0" in self.calls
            return (
                "7.batch batch\n"
                + ("" if termed else "7.0 python3\n")
                + ("7.1 slurmtf-watcher\n7.extern extern\n")
            )
        if list(args) == ["scontrol", "show", "config"]:
            self.calls.append(shlex.join(args))
            return self.CONFIG
        return super().__call__(args, **kwargs)


def test_the_job_s_other_steps_are_cancelled_right_before_the_requeue(tmp_path: Path) -> None:
    """Their tasks on the healthy nodes end before the requeue's terminate request (which
    on 22.05 arms the timer that drained node2 'Kill task failed'); its own step aside."""
    beat(tmp_path)
    slurm = StepsSlurm(dead=["node1"])
    assert watch(tmp_path, slurm, beats=1)[0] == 0
    cancels = slurm.ran("scancel")
    assert cancels == ["scancel --ctld --signal=TERM 7.0", "scancel 7.0"]  # a rank saves, then goes
    assert slurm.calls.index(cancels[-1]) == slurm.calls.index("scontrol requeue 7") - 1


def test_with_the_budget_spent_no_step_is_cancelled_the_job_is(tmp_path: Path) -> None:
    beat(tmp_path)
    slurm = StepsSlurm(dead=["node1"])
    assert watch(tmp_path, slurm, beats=1, budget=0)[0] == 0
    assert slurm.ran("scancel") == ["scancel 7"]
    assert slurm.ran("scontrol requeue") == []


def test_the_watcher_says_at_its_start_when_the_kill_timers_can_drain_a_node(
    tmp_path: Path,
) -> None:
    beat(tmp_path, state="ended")
    assert watch(tmp_path, StepsSlurm(), beats=0)[0] == 0
    said = (tmp_path / "job.out").read_text()
    assert "HINT: an admin sets UnkillableStepTimeout=178 or more in slurm.conf" in said


class EndedSlurm(FakeSlurm):
    """The job ends: scontrol says its batch step's ExitCode is ``code``."""

    def __init__(self, code: str) -> None:
        super().__init__()
        self.code = code

    def __call__(self, args: Sequence[str], **kwargs: Any) -> str:
        if args[:3] == ["scontrol", "show", "job"]:
            self.calls.append(shlex.join(args))
            return f"JobId=7 JobState=COMPLETING Reason=None ExitCode={self.code} NumNodes=2\n"
        return super().__call__(args, **kwargs)


def backstop(tmp_path: Path, slurm: FakeSlurm, state: str = "running") -> None:
    beat(tmp_path, state=state)
    clock = Clock()
    watcher = Watcher(settings(tmp_path), slurm, clock=clock, sleep=clock.sleep)
    assert watcher.backstop() == 0


def test_a_keeper_killed_with_its_supervisor_is_requeued_by_the_watcher(tmp_path: Path) -> None:
    """SIGTERM, the heartbeat still says running, the batch step ended by SIGKILL."""
    slurm = EndedSlurm("0:9")
    backstop(tmp_path, slurm)
    assert slurm.ran("scontrol requeue") == ["scontrol requeue 7"]
    (record,) = read_record(tmp_path, "7")
    assert (record["kind"], record["action"]) == ("keeper", "requeue")
    assert record["line"].startswith("the keeper and the supervisor on node1 were killed")
    written = read_beat(beat_path(tmp_path, "7"))
    assert written is not None
    assert written.state == "requeueing"


ENDINGS = [("0:15", "running"), ("0:9", "stopping"), ("0:9", "requeueing"), ("0:0", "running")]


@pytest.mark.parametrize(("code", "state"), ENDINGS)
def test_a_job_that_ends_otherwise_is_not_requeued_by_the_backstop(
    tmp_path: Path, code: str, state: str
) -> None:
    slurm = EndedSlurm(code)
    backstop(tmp_path, slurm, state)
    assert slurm.ran("scontrol requeue") == []
    assert read_record(tmp_path, "7") == []
