"""The nodes of the next step after a node is lost (runtime.recovery.node_choice.Nodes,
job_nodes) and the watch during a step (runtime.recovery.evidence.lost_in, probe_lost):
spares, ranges, strikes, probes."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from slurmtf.errors import InputError, SlurmCommandError
from slurmtf.runtime import slurm_calls
from slurmtf.runtime.job.settings import JobSettings, restart_in_place
from slurmtf.runtime.recovery.after_step import Step, decide_and_record
from slurmtf.runtime.recovery.decision import Budget, decide
from slurmtf.runtime.recovery.endings import Attempt, TaskEnding
from slurmtf.runtime.recovery.evidence import LogFiles, lost_in, probe_lost, survivors_saved
from slurmtf.runtime.recovery.node_choice import Nodes, job_nodes
from slurmtf.runtime.slurm_calls import drained_nodes, probe_args

ALLOC = ("node1", "node2", "node3")
LOST_PEER = Attempt(
    status=137,
    endings=(TaskEnding((0,), "Exited with exit code 1"),),
    events={0: [{"event": "peer_lost", "lost": [{"rank": 1, "node": "node2"}]}]},
)


@pytest.mark.parametrize(
    ("nodes", "step"),
    [
        (Nodes(ALLOC, minimum=2, width=2), ("node1", "node2")),  # node3 a spare
        (Nodes(ALLOC, minimum=2, width=2, dead=("node2",)), ("node1", "node3")),  # on it
        (Nodes(ALLOC, minimum=2, dead=("node3",)), ("node1", "node2")),  # a range: survivors
        (Nodes(ALLOC, minimum=1, width=2, dead=("node1", "node3")), ("node2",)),
    ],
)
def test_the_next_step_takes_a_spare_or_the_survivors(nodes: Nodes, step: tuple[str, ...]) -> None:
    assert nodes.step_nodes() == step


@pytest.mark.parametrize(
    ("nodes", "words"),
    [
        (Nodes(ALLOC, minimum=2, width=2, dead=("node2",)), "training on a spare (node3)"),
        (Nodes(ALLOC, minimum=2, dead=("node3",)), "training on the 2 node(s) left (minimum 2)"),
    ],
)
def test_the_placement_in_words(nodes: Nodes, words: str) -> None:
    assert nodes.placement() == words


def test_a_node_whose_ranks_crashed_twice_is_never_used_again() -> None:
    once = Nodes(ALLOC, minimum=2, width=2, crashes=(("node2", 1),))
    twice = Nodes(ALLOC, minimum=2, width=2, crashes=(("node2", 2),))
    assert once.next_excluded() == ()
    assert twice.next_excluded() == ("node2",)
    assert twice.step_nodes() == ("node1", "node3")
    # without a spare or a range the job cannot go on without it: requeued without it
    stuck = Nodes(ALLOC, minimum=3, crashes=(("node2", 5),))
    assert stuck.next_excluded() == ("node2",)
    killed = Attempt(status=137, endings=(TaskEnding((1,), "Killed"),))
    decision = decide(killed, Budget(0, 3), stuck)
    assert (decision.action, decision.exclude) == ("requeue", ("node2",))


def test_only_the_first_crash_strikes_its_node_once() -> None:
    """srun's lines after one crashed rank of a 3-node x 4-task step: the rank, then the
    tasks srun itself ended. Only the crashed rank's node is struck, and once; a rank
    killed from outside (SIGKILL, SIGTERM, ...) strikes none."""
    workers = [f"node{r // 4 + 1}:{12000 + r}" for r in range(12)]
    events = {r: [{"event": "cluster", "rank": r, "workers": workers}] for r in range(12)}
    lines = ["task 5: Segmentation fault", "tasks 8-11: Terminated", "tasks 4,6-7: Terminated",
             "tasks 0-3: Killed"]  # fmt: skip
    endings = tuple(e for e in map(TaskEnding.parse, lines) if e is not None)
    assert Attempt(139, endings, events).crashed_nodes() == ("node2",)
    both = (TaskEnding.parse("tasks 4-5: Bus error"),)
    assert Attempt(135, tuple(e for e in both if e), events).crashed_nodes() == ("node2",)
    exited = tuple(e for e in map(TaskEnding.parse, ["task 0: Exited with exit code 1",
                                                   "tasks 1-11: Killed"]) if e)  # fmt: skip
    assert Attempt(1, exited, events).crashed_nodes() == ()
    for word in ("Killed", "Terminated", "Interrupt", "Hangup", "User defined signal 1"):
        outside = tuple(e for e in (TaskEnding.parse(f"task 5: {word}"),) if e)
        assert Attempt(137, outside, events).crashed_nodes() == (), word


def test_a_silent_node_with_a_spare_restarts_in_place_on_the_spare() -> None:
    nodes = Nodes(ALLOC, minimum=2, width=2, dead=("node2",))
    decision = decide(LOST_PEER, Budget(0, 3), nodes)
    assert (decision.action, decision.exclude, decision.nodes) == (
        "restart",
        ("node2",),
        ("node1", "node3"),
    )
    line = decision.line("7", 11)
    assert line.startswith(
        "restart 1 in place (1 of 3 without progress, MAX_RESTARTS), 11.0 s after node2 stopped"
    )
    assert line.endswith("; node2 left out, training on a spare (node3)")


def test_too_few_nodes_left_requeue() -> None:
    nodes = Nodes(ALLOC, minimum=2, width=2, dead=("node2",), excluded=("node3",))
    assert decide(LOST_PEER, Budget(0, 3), nodes).action == "requeue"


@pytest.mark.parametrize(
    ("spares", "least", "width", "minimum", "first"),
    [
        ("", "", 0, 3, ALLOC),
        ("1", "", 2, 2, ("node1", "node2")),
        ("", "2", 0, 2, ALLOC),
        ("1", "1", 2, 1, ("node1", "node2")),
    ],
)
def test_the_job_scripts_spare_and_minimum(
    spares: str, least: str, width: int, minimum: int, first: tuple[str, ...]
) -> None:
    nodes = job_nodes(ALLOC, spares, least)
    assert (nodes.width, nodes.minimum, nodes.first_step()) == (width, minimum, first)


@pytest.mark.parametrize(
    ("spares", "least", "name", "value"),
    [
        ("3", "", "SPARE_NODES", 3),
        ("x", "", "SPARE_NODES", "x"),
        ("-1", "", "SPARE_NODES", "-1"),
        ("1", "3", "MIN_NODES", 3),
        ("", "0", "MIN_NODES", 0),
        ("", "two", "MIN_NODES", "two"),
    ],
)
def test_bad_spare_or_minimum_names_the_variable(
    spares: str, least: str, name: str, value: object
) -> None:
    with pytest.raises(InputError, match="HINT: ") as info:
        job_nodes(ALLOC, spares, least)
    assert (info.value.name, info.value.value) == (name, value)


def test_every_probe_overlaps_the_old_step() -> None:
    args = probe_args("node2")
    assert args[:2] == ["srun", "--overlap"]
    assert "--nodelist=node2" in args


def peer_lost_logs(tmp_path: Path) -> LogFiles:
    event = {"event": "peer_lost", "rank": 0, "lost": [{"rank": 1, "node": "node2"}]}
    (tmp_path / "rank0.out").write_text(json.dumps(event) + "\n")
    (tmp_path / "rank1.out").write_text("")
    return LogFiles(tmp_path)


def silent(*nodes: str, drained: str = "") -> Any:
    """A fake runner: ``nodes`` do not answer a probe; sinfo reports ``drained`` drained."""
    probed: list[str] = []

    def runner(args: Any, **_: Any) -> str:
        if args[0] == "sinfo":
            return "".join(f"{n} {'drained' if n == drained else 'allocated'}\n" for n in ALLOC)
        node = next(a.split("=", 1)[1] for a in args if a.startswith("--nodelist="))
        probed.append(node)
        if node in nodes:
            raise SlurmCommandError("srun", 1, f"{node} does not answer")
        return ""

    runner.probed = probed  # type: ignore[attr-defined]
    return runner


def test_a_drained_node_is_never_used_again(tmp_path: Path) -> None:
    (tmp_path / "srun.err").write_text("srun: error: node3: task 2: Killed\n")
    files = LogFiles(tmp_path, srun_err=tmp_path / "srun.err")
    drained = silent(drained="node3")
    ranged, line = decide_and_record(
        Step("7", 137, 3, nodes=job_nodes(ALLOC, "", "2")), files, drained
    )
    assert (ranged.action, ranged.exclude, ranged.nodes) == (
        "restart",
        ("node3",),
        ("node1", "node2"),
    )
    assert "node3 left out, training on the 2 node(s) left (minimum 2)" in line
    # a job that cannot train on fewer (a fixed size, or a range whose minimum neither
    # MIN_NODES nor Slurm names: 22.05 to 25.05) is requeued without it, never on it
    full, _ = decide_and_record(Step("8", 137, 3, nodes=job_nodes(ALLOC)), files, drained)
    assert (full.action, full.exclude) == ("requeue", ("node3",))


@pytest.mark.parametrize(
    ("states", "out"),
    [
        ("node1 allocated\nnode2 draining\nnode3 down*\n", ("node2", "node3")),
        ("node1 mixed\nnode2 idle\nnode3 allocated\n", ()),
        ("node1 fail\nnode2 drained\n", ("node1", "node2")),
        ("", ()),
    ],
)
def test_drained_nodes_reads_sinfo_states(states: str, out: tuple[str, ...]) -> None:
    assert drained_nodes(ALLOC, lambda args, **_: states) == out


def test_drained_nodes_is_none_when_sinfo_fails() -> None:
    def broken(args: Any, **_: Any) -> str:
        raise SlurmCommandError("sinfo", 1, "slurm_load_node: Unable to contact slurm controller")

    assert drained_nodes(ALLOC, broken) == ()


PEER_LOST = [{"event": "peer_lost", "rank": 0, "lost": [{"rank": 1, "node": "node2"}]}]


def test_the_watch_names_a_lost_node_that_does_not_answer() -> None:
    lost, alive = probe_lost(lost_in(PEER_LOST), Nodes(ALLOC), (), silent("node2"), 1)
    assert (lost, alive) == (("node2",), ())


def test_the_watch_probes_a_node_once_and_leaves_one_that_answers() -> None:
    runner = silent()
    said = lost_in(PEER_LOST)
    assert probe_lost(said, Nodes(ALLOC), (), runner, 1) == ((), ("node2",))
    assert probe_lost(said, Nodes(ALLOC), ("node2",), runner, 1) == ((), ("node2",))
    assert runner.probed == ["node2"]


def test_the_watch_leaves_excluded_nodes_unprobed() -> None:
    runner = silent("node2")
    left_out = Nodes(ALLOC, excluded=("node2",))
    assert probe_lost(lost_in(PEER_LOST), left_out, (), runner, 1) == ((), ())
    assert runner.probed == []


def test_the_step_ends_without_a_grace_once_every_survivor_saved(tmp_path: Path) -> None:
    """Ranks 0 and 2 (node1, node3) outlive node2's rank 1: no grace is needed once both
    reported the loss, which they do after their save from memory."""
    files = LogFiles(tmp_path, offsets={str(tmp_path / "rank0.out"): 7})
    workers = ["node1:29003", "node2:29004", "node3:29005"]
    cluster = {"event": "cluster", "rank": 0, "workers": workers}
    (tmp_path / "rank0.out").write_text("before\n" + json.dumps(cluster) + "\n")
    first = [{"event": "peer_lost", "rank": 0, "lost": [{"rank": 1, "node": "node2"}]}]
    assert not survivors_saved(files, first, ("node2",))
    both = [*first, {"event": "peer_lost", "rank": 2, "lost": [{"rank": 1}]}]
    assert survivors_saved(files, both, ("node2",))
    assert not survivors_saved(files, both, ())  # rank 1 lives: it has not said
    earlier = LogFiles(tmp_path, offsets={str(tmp_path / "rank0.out"): 10_000})
    assert not survivors_saved(earlier, both, ("node2",))  # no cluster event this attempt


def test_the_decision_after_the_watch_does_not_probe_again(tmp_path: Path) -> None:
    runner = silent("node2")
    files = peer_lost_logs(tmp_path)
    step = Step("7", 137, 3, nodes=job_nodes(ALLOC, "1"), dead=("node2",))
    out, _ = decide_and_record(step, files, runner)
    assert (out.action, out.nodes) == ("restart", ("node1", "node3"))
    assert runner.probed == []
    record = json.loads((tmp_path / "recovery-7.jsonl").read_text())
    assert record["nodes"] == ["node1", "node3"]


def test_crashes_per_node_are_recorded_and_counted_across_attempts(tmp_path: Path) -> None:
    """Two SIGSEGVs on node2 of a job with a spare: the second leaves node2 out."""
    workers = ["node1:12000", "node2:12001", "node3:12002"]
    (tmp_path / "rank0.out").write_text(json.dumps({"event": "cluster", "workers": workers}))
    (tmp_path / "srun.err").write_text("srun: error: node2: task 1: Segmentation fault\n")
    files = LogFiles(tmp_path, srun_err=tmp_path / "srun.err")
    step = Step("7", 139, 5, nodes=job_nodes(ALLOC, "1"))
    first, _ = decide_and_record(step, files, silent())
    second, _ = decide_and_record(step, files, silent())
    assert first.exclude == ()
    assert (second.exclude, second.nodes) == (("node2",), ("node1", "node3"))


def test_after_the_watch_other_named_nodes_are_probed_not_assumed_dead(tmp_path: Path) -> None:
    lost = [{"rank": 0, "node": "node1"}, {"rank": 2, "node": "node3"}]
    event = {"event": "peer_lost", "rank": 1, "lost": lost, "heartbeat": True}
    (tmp_path / "rank1.out").write_text(json.dumps(event) + "\n")
    runner = silent("node3")
    step = Step("7", 137, 3, nodes=job_nodes(ALLOC, "", "2"), dead=("node3",))
    out, _ = decide_and_record(step, LogFiles(tmp_path), runner)
    assert (out.action, out.exclude) == ("restart", ("node3",))
    assert runner.probed == ["node1"]


def test_restart_in_place_off_requeues_instead(tmp_path: Path) -> None:
    (tmp_path / "srun.err").write_text("srun: error: node2: task 1: Killed\n")
    files = LogFiles(tmp_path, srun_err=tmp_path / "srun.err")
    step = Step("7", 137, 3, nodes=job_nodes(ALLOC), in_place=False)
    out, line = decide_and_record(step, files, silent())
    assert out.action == "requeue"
    assert "failed: rank 1 was killed by SIGKILL: requeueing job 7 (restart 1, 1 of 3" in line


def test_a_node_the_watch_found_answering_is_not_probed_again(tmp_path: Path) -> None:
    runner = silent("node2")  # it would not answer now: the decision trusts the watch
    step = Step("7", 137, 3, nodes=job_nodes(ALLOC, "1"), alive=("node2",))
    out, _ = decide_and_record(step, peer_lost_logs(tmp_path), runner)
    assert out.exclude == ()
    assert runner.probed == []


@pytest.mark.parametrize(("text", "expected"), [("1", True), ("0", False)])
def test_restart_in_place_as_typed(text: str, expected: bool) -> None:
    assert restart_in_place(text) is expected


@pytest.mark.parametrize("text", ["yes", "", "2", " 1"])
def test_a_bad_restart_in_place_names_the_variable(text: str) -> None:
    with pytest.raises(InputError, match=r"SLURMTF_RESTART_IN_PLACE=.*must be 1 or 0\. HINT:"):
        restart_in_place(text)


@pytest.mark.parametrize(("text", "expected"), [(None, True), ("1", True), ("0", False)])
def test_the_settings_reader_parses_restart_in_place(text: str | None, expected: bool) -> None:
    environ = {} if text is None else {"SLURMTF_RESTART_IN_PLACE": text}
    assert JobSettings.read("mnist", environ).in_place is expected
    with pytest.raises(InputError, match="SLURMTF_RESTART_IN_PLACE"):
        JobSettings.read("mnist", {"SLURMTF_RESTART_IN_PLACE": "yes"})


def test_the_nodes_events_name_the_lost_nodes_in_order_of_mention() -> None:
    """What the supervisor's look read from the nodes' files: each peer_lost's nodes, once,
    first mention first; other events and peers without a node say nothing."""
    events = [
        {"event": "progress", "step": 3},
        {"event": "peer_lost", "rank": 0, "lost": [{"rank": 9, "node": "node3"}, {"rank": 4}]},
        {"event": "peer_lost", "rank": 5, "lost": [{"rank": 0, "node": "node1"}]},
        {"event": "peer_lost", "rank": 0, "lost": [{"rank": 10, "node": "node3"}]},
    ]
    assert lost_in(events) == ("node3", "node1")
    assert lost_in(events[:1]) == ()
    failure = "srun: error: Node failure on node2\n"  # srun's stderr: probed beside them
    assert lost_in(events, failure) == ("node3", "node1", "node2")
    assert lost_in(events[:1], failure) == ()  # only when a rank lost a peer
    runner = silent("node3")
    assert probe_lost(lost_in(events), Nodes(ALLOC), (), runner, 1) == (("node3",), ("node1",))
    assert sorted(runner.probed) == ["node1", "node3"]  # side by side, each once


def test_three_sigkills_on_a_two_node_job_restart_in_place_every_time(tmp_path: Path) -> None:
    """The OOM killer or anyone's kill -9 (rank 1, rank 0, rank 1) is no evidence against a
    node: every one restarts in place on both nodes, within the budget."""
    workers = ["node1:12000", "node2:12001"]
    (tmp_path / "rank0.out").write_text(json.dumps({"event": "cluster", "workers": workers}))
    files = LogFiles(tmp_path, srun_err=tmp_path / "srun.err")
    step = Step("7", 137, 10, nodes=job_nodes(("node1", "node2")))
    for rank, restart in ((1, 1), (0, 2), (1, 3)):
        (tmp_path / "srun.err").write_text(f"srun: error: node{rank + 1}: task {rank}: Killed\n")
        out, line = decide_and_record(step, files, silent())
        assert (out.action, out.restart, out.exclude) == ("restart", restart, ()), line
        assert out.nodes in ((), ("node1", "node2")), line


def test_a_heterogeneous_jobs_probe_left_running_at_its_timeout(tmp_path: Path) -> None:
    """A component's probe that does not answer is judged silent but not killed (its
    srun's death would make Slurm 26.05 cancel the whole job): real processes."""
    from slurmtf.runtime.slurm_calls import left_running
    from slurmtf.slurm.runner import default_runner

    marker = tmp_path / "still-here"
    slow = ["sh", "-c", f"sleep 1.5; touch {marker}"]
    started = time.monotonic()
    assert subprocess.run(left_running(slow, 0.3), check=False).returncode == 124
    assert time.monotonic() - started < 1.4  # it did not wait for the probe
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), "the probe was killed with its shell"
    assert subprocess.run(left_running(["true"], 5), check=False).returncode == 0
    assert subprocess.run(left_running(["false"], 5), check=False).returncode == 1
    with pytest.raises(SlurmCommandError):
        default_runner(left_running(["sleep", "3"], 0.2), timeout=5)


def test_only_a_component_probe_is_left_running() -> None:
    seen: list[list[str]] = []

    def runner(args: Sequence[str], **_: Any) -> str:
        seen.append(list(args))
        return ""

    assert slurm_calls.probe_dead(["node1"], runner, 10) == ()
    assert seen[-1][0] == "srun"
    assert slurm_calls.probe_dead(["node1"], runner, 10, group=0) == ()
    assert seen[-1][:2] == ["sh", "-c"]
    assert "srun --overlap --nodes=1 --ntasks=1 --nodelist=node1 --het-group=0" in seen[-1][2]
