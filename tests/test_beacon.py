"""The nodes' beacon: its verdicts (pure), its srun read by a thread (a fake srun on
PATH that speaks for some nodes and falls silent for others), and the probe it spares."""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import time
from pathlib import Path

import pytest

from slurmtf.runtime.job.beacon import BEAT_S, Beacon, Heard, beacon_args
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.runtime.job.step_nodes import first_placement, next_placement
from slurmtf.runtime.recovery.budget import Budget
from slurmtf.runtime.recovery.decision import decide, restart_without
from slurmtf.runtime.recovery.endings import Attempt, TaskEnding
from slurmtf.runtime.recovery.evidence import probe_lost
from slurmtf.runtime.recovery.node_choice import Nodes
from slurmtf.runtime.slurm_calls import BEACON_NAME


def test_a_node_heard_before_and_silent_while_others_speak_is_silent() -> None:
    heard = Heard()
    for at in (0.0, 1.0, 2.0):
        heard.note("node1\n", at)
        heard.note("node2\n", at)
    for at in (3.0, 4.0, 5.0, 6.0):
        heard.note("node1\n", at)
    assert heard.verdict("node2", now=6.0) is True
    assert heard.verdict("node1", now=6.0) is False
    assert heard.verdict("node3", now=6.0) is None  # never heard: the probe decides


def test_every_node_silent_at_once_is_no_verdict() -> None:
    """A stalled srun (or batch host) stops every node's words together: no node is
    declared lost for it."""
    heard = Heard()
    heard.note("node1", 0.0)
    heard.note("node2", 0.0)
    assert heard.verdict("node2", now=30.0) is None
    assert heard.verdict("node2", now=1.0) is False


def test_beacon_args_run_one_task_per_node_beside_the_job() -> None:
    args = beacon_args(["node1", "node3"])
    assert args[0] == "srun"
    for flag in ("--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--overlap",
                 "--nodelist=node1,node3", f"--job-name={BEACON_NAME}"):  # fmt: skip
        assert flag in args, args
    assert "$SLURMD_NODENAME" in args[-1]


FAKE_SRUN = """#!/bin/sh
# speaks for node1 every 0.1 s; for node2 only SILENT_AFTER times (then it "hangs")
n=0
while :; do
    echo node1
    if [ "$n" -lt "${SILENT_AFTER:-1000000}" ]; then echo node2; fi
    n=$((n + 1))
    sleep 0.1
done
"""


@pytest.fixture
def fake_srun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(FAKE_SRUN)
    srun.chmod(srun.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return srun


def beacon(silent_after: int) -> Beacon:
    env = {**os.environ, "SILENT_AFTER": str(silent_after)}
    return Beacon(["node1", "node2"], env, silent_s=0.6)


def wait_heard(b: Beacon, node: str) -> None:
    deadline = time.monotonic() + 10
    while node not in b.heard.last:
        assert time.monotonic() < deadline, f"the beacon never heard {node}"
        time.sleep(0.05)


def test_a_node_that_stops_speaking_is_found_silent_within_the_limit(fake_srun: Path) -> None:
    b = beacon(silent_after=3)
    try:
        wait_heard(b, "node2")
        time.sleep(0.4)  # node2's three words are said; asked within 0.6 s of its last
        started = time.monotonic()
        assert b.silent(["node2", "node1"]) == ("node2",)
        waited = time.monotonic() - started
        assert 0.1 < waited < 0.6 + 1.0, waited  # waited for node2's next word, in vain
        assert b.silent(["node2"]) == ("node2",)  # long silent: at once
    finally:
        b.stop()
    assert b.child.poll() is not None, "the beacon's srun outlived stop()"


def test_nodes_that_speak_are_not_silent_and_answer_within_a_beat(fake_srun: Path) -> None:
    b = beacon(silent_after=1_000_000)
    try:
        wait_heard(b, "node2")
        started = time.monotonic()
        assert b.silent(["node1", "node2"]) == ()
        assert time.monotonic() - started < BEAT_S
        assert b.silent(["node9"]) == ()  # not a node of the beacon
    finally:
        b.stop()


def test_a_beacon_that_ended_finds_no_node_silent(tmp_path: Path, fake_srun: Path) -> None:
    fake_srun.write_text("#!/bin/sh\necho node1\necho node2\n")
    b = beacon(silent_after=0)
    b.child.proc.wait(timeout=10)
    assert b.silent(["node2"]) == ()  # the probe decides
    b.stop()


def test_probe_lost_probes_only_the_nodes_the_beacon_does_not_find_silent() -> None:
    probed: list[str] = []

    def runner(args: list[str], timeout: float) -> str:
        probed.append(next(a.split("=", 1)[1] for a in args if a.startswith("--nodelist=")))
        return ""

    def silent(nodes: object) -> tuple[str, ...]:
        return ("node2",)

    dead, alive = probe_lost(["node2", "node3"], Nodes(), (), runner, 10.0, silent=silent)  # type: ignore[arg-type]
    assert dead == ("node2",)
    assert alive == ("node3",)
    assert probed == ["node3"]


def test_the_log_says_how_long_a_silent_node_was_silent(fake_srun: Path) -> None:
    b = beacon(silent_after=2)
    try:
        wait_heard(b, "node2")
        time.sleep(0.4)  # its two words said
        assert b.silent(["node2"]) == ("node2",)
        said = b.silences(["node2", "node7"])
        assert re.fullmatch(r"node2 silent for \d+\.\d s", said), said
        assert float(said.split()[-2]) >= 0.6
    finally:
        b.stop()


@pytest.mark.parametrize(
    ("env", "lost", "nodes"),
    [
        ({"SPARE_NODES": "1"}, ("node2",), "node1,node3"),  # the spare takes node2's place
        ({"MIN_NODES": "2"}, ("node3",), "node1,node2"),  # a range: the nodes left
        ({}, ("node2",), None),  # too few left: a requeue, no warm ranks to move
    ],
)
def test_the_warm_ranks_move_where_the_decision_will_place_the_next_step(
    env: dict[str, str], lost: tuple[str, ...], nodes: str | None
) -> None:
    """The beacon finds a node silent before the ranks report it: the next attempt's warm
    ranks start on the placement the decision then gives, so that they can take over."""
    environ = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-3]",
               "SLURM_JOB_NUM_NODES": "3", "SLURM_NNODES": "3", "LOG_DIR": "/l", **env}  # fmt: skip
    job = JobSettings.read("mnist", environ)
    allocation, place = first_placement(job)
    now = dataclasses.replace(allocation, excluded=place.excluded)
    guess = restart_without(now, lost)
    budget = Budget(used=0, limit=3)
    after = dataclasses.replace(now, dead=lost)
    decision = decide(Attempt(137, (TaskEnding((1,), "Killed"),)), budget, after)
    if nodes is None:
        assert guess is None
        assert decision.action == "requeue"
        return
    assert decision.action == "restart", decision
    assert guess is not None
    moved = next_placement(job, place, guess)
    assert moved == next_placement(job, place, decision)
    assert f"--nodelist={nodes}" in moved.flags
    assert ",".join(guess.nodes) == nodes


def test_a_beacon_whose_srun_ignores_sigterm_ends_at_once_when_asked(fake_srun: Path) -> None:
    """After a node is lost its step is cancelled; an srun spanning the silent node would
    not end on SIGTERM, so the supervisor does not wait for it."""
    fake_srun.write_text("#!/bin/sh\ntrap '' TERM\nwhile :; do echo node1; sleep 0.1; done\n")
    b = beacon(silent_after=0)
    wait_heard(b, "node1")
    started = time.monotonic()
    b.stop(at_once=True)
    assert time.monotonic() - started < 1.0
    assert b.child.poll() is not None
