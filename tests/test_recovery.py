"""slurmtf.runtime.recovery.decision: what follows a step, as a table of endings -> decisions.
No Slurm, no TensorFlow: values in, a Decision out; the edge on files the tests write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slurmtf.errors import SlurmCommandError
from slurmtf.runtime.recovery.after_step import Step, decide_and_record
from slurmtf.runtime.recovery.decision import Budget, after_check, classify, decide
from slurmtf.runtime.recovery.endings import Attempt, TaskEnding, srun_words, task_ranks
from slurmtf.runtime.recovery.evidence import LogFiles, own_error, read_attempt
from slurmtf.runtime.recovery.node_choice import Nodes
from slurmtf.runtime.recovery.record import read_record, restarts_so_far

PEER = {"event": "peer_lost", "rank": 0, "lost": [{"rank": 1, "node": "node2"}]}
FROZEN = {**PEER, "heartbeat": True}
STALLED = {"event": "stalled", "message": "no training step finished"}
WORKER = {"event": "serving", "role": "worker"}
PS = {"event": "serving", "role": "ps"}


def ending(line: str) -> TaskEnding:
    found = TaskEnding.parse(line)
    assert found is not None, line
    return found


def attempt(status: int, *lines: str, **events: Any) -> Attempt:
    ranks = {int(k.removeprefix("r")): v for k, v in events.items()}
    return Attempt(status, tuple(ending(x) for x in lines), ranks, {1: "ValueError: bad"})


# (name, attempt, budget used, expected action, words of the why, exit status)
CASES = [
    ("all done", attempt(0), 0, "done", "completed", 0),
    ("killed", attempt(137, "task 1: Killed", "task 0: Exited with exit code 1", r0=[PEER]),
     0, "restart", "rank 1 was killed by SIGKILL", 137),
    ("killed via launcher", attempt(1, "task 1: Exited with exit code 137"),
     0, "restart", "rank 1 was killed by SIGKILL", 1),
    ("segfault", attempt(139, "task 1: Segmentation fault (core dumped)"),
     0, "restart", "SIGSEGV", 139),
    ("lost peer", attempt(1, "task 0: Exited with exit code 1", r0=[PEER]),
     0, "restart", "rank 0 lost a peer or saw a stall", 1),
    ("stall", attempt(1, "task 0: Exited with exit code 1", r0=[STALLED]),
     0, "restart", "saw a stall", 1),
    ("own error", attempt(1, "task 1: Exited with exit code 1", "task 0: Killed"),
     0, "stop", "rank 1 failed with its own error (exit code 1): ValueError: bad", 1),
    ("bad flags", attempt(2, "tasks 0-1: Exited with exit code 2"),
     0, "stop", "bad flags or settings (exit 2)", 2),
    ("plain exit", attempt(1), 0, "stop", "without a lost peer, node or killed task", 1),
    ("preempted", attempt(75), 0, "requeue", "preempted after saving a checkpoint", 75),
    ("preempted first", attempt(143, "task 1: Exited with exit code 75", "task 0: Terminated"),
     0, "requeue", "preempted", 75),
    ("preempted event", attempt(0, r0=[{"event": "done", "preempted": True}]),
     0, "requeue", "preempted", 75),
    ("budget spent", attempt(137, "task 1: Killed"), 3, "stop",
     "rank 1 was killed by SIGKILL; not restarted: already restarted 3 time(s) in a row "
     "without progress (MAX_RESTARTS=3)",
     137),
    ("preempted, budget spent", attempt(75), 3, "stop", "not restarted", 75),
    ("worker killed", attempt(137, "task 4: Killed", r4=[WORKER]),
     0, "done", "tolerated the loss of worker rank 4 (SIGKILL)", 0),
    ("workers grouped", attempt(137, "tasks 3-4: Killed", r3=[WORKER], r4=[WORKER]),
     0, "done", "rank 3 (SIGKILL), rank 4 (SIGKILL)", 0),
    ("ps killed", attempt(137, "task 1: Killed", r1=[PS]), 0, "restart", "rank 1 was killed", 137),
    ("chief after worker", attempt(137, "task 4: Killed", "task 0: Killed", r4=[WORKER]),
     0, "restart", "rank 0 was killed by SIGKILL", 137),
    ("chief error after worker",
     attempt(1, "task 4: Killed", "task 1: Exited with exit code 1", r4=[WORKER]),
     0, "stop", "rank 1 failed with its own error", 1),
    ("worker own error", attempt(1, "task 4: Exited with exit code 1", r4=[WORKER]),
     0, "stop", "rank 4 failed with its own error", 1),
    # srun killed (137) after a node failure, no task line: retried. (Status 1 with no task
    # line is Slurm 23.02+'s way of saying every other task exited 0: tests/test_slurm_versions)
    ("node failure", Attempt(137, failed_nodes=("node2",)), 0, "restart", "Node failure on node2",
     137),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_an_ending_decides_the_next_step(case: tuple[Any, ...]) -> None:
    _name, ended, used, action, words, status = case
    decision = decide(ended, Budget(used, 3))
    assert decision.action == action, decision
    assert words in decision.why, decision
    assert decision.status == status, decision
    if action in ("restart", "requeue"):
        assert decision.restart == used + 1


# (allocated, excluded before, minimum, dead) -> action, exclude
NODE_CASES = [
    (("n1", "n2"), (), 2, (), "restart", ()),
    (("n1", "n2"), (), 2, ("n2",), "requeue", ("n2",)),
    (("n1", "n2", "n3"), (), 2, ("n2",), "restart", ("n2",)),  # a spare
    (("n1", "n2", "n3"), ("n3",), 2, ("n2",), "requeue", ("n3", "n2")),
    (("n1", "n2", "n3"), (), 1, ("n1", "n2"), "restart", ("n1", "n2")),  # a range 1-3
]


@pytest.mark.parametrize("case", NODE_CASES)
def test_dead_nodes_are_left_out_while_enough_remain(case: tuple[Any, ...]) -> None:
    allocated, excluded, minimum, dead, action, exclude = case
    nodes = Nodes(allocated, excluded, minimum, dead)
    decision = decide(attempt(1, "task 0: Exited with exit code 1", r0=[PEER]), Budget(0, 3), nodes)
    assert (decision.action, decision.exclude) == (action, exclude), decision
    if action == "restart" and dead:
        assert f"{','.join(dead)} left out" in decision.line("7", 3.0)


def test_the_log_line_names_the_restart_and_how_long_after() -> None:
    decision = decide(attempt(137, "task 1: Killed"), Budget(0, 3))
    assert decision.line("77", 11.2) == (
        "restart 1 in place (1 of 3 without progress, MAX_RESTARTS), 11.2 s after rank 1 was "
        "killed by SIGKILL"
    )
    requeue = decide(attempt(75), Budget(1, 3))
    assert requeue.line("77") == (
        "preempted after saving a checkpoint: requeueing job 77 (restart 2, 2 of 3 without "
        "progress, MAX_RESTARTS)"
    )


@pytest.mark.parametrize(
    ("used", "nodes", "action"),
    [
        (0, Nodes(("n1", "n2", "n3"), (), 2), "restart"),
        (0, Nodes(("n1", "n2"), (), 2), "requeue"),
        (2, Nodes(("n1", "n2", "n3"), (), 2), "stop"),
    ],
)
def test_check_first_outliers_are_left_out_in_place(used: int, nodes: Nodes, action: str) -> None:
    decision = after_check(["n2"], Budget(used, 2), nodes)
    assert decision.action == action, decision
    assert "check_first found outlier node(s) n2" in decision.why
    if action != "stop":
        assert decision.exclude == ("n2",)
    else:
        assert "not training on an outlier node (MAX_RESTARTS=2 spent)" in decision.why


@pytest.mark.parametrize(
    ("text", "ranks"), [("4", (4,)), ("3-4", (3, 4)), ("1,3-4", (1, 3, 4)), ("x", ())]
)
def test_srun_task_lists(text: str, ranks: tuple[int, ...]) -> None:
    assert task_ranks(text) == ranks


@pytest.mark.parametrize(
    ("reason", "sig"),
    [
        ("Killed", "SIGKILL"),
        ("Exited with exit code 137", "SIGKILL"),
        ("Exited with exit code 1", None),
        ("Aborted (core dumped)", "SIGABRT"),
        ("Something odd", "a signal (Something odd)"),
    ],
)
def test_the_signal_of_a_task_ending(reason: str, sig: str | None) -> None:
    assert TaskEnding((1,), reason).signal == sig


def test_the_budget_counts_restarts_in_place_and_requeues() -> None:
    records = [{"action": "restart"}, {"action": "requeue"}, {"action": "stop"}]
    assert restarts_so_far(records, 1) == 2
    assert restarts_so_far(records, 3) == 4  # Slurm requeued twice by itself


def logs(tmp_path: Path) -> LogFiles:
    (tmp_path / "srun.err").write_text("old: task 0: Killed\n")
    offset = (tmp_path / "srun.err").stat().st_size
    with (tmp_path / "srun.err").open("a") as f:
        f.write("srun: error: node2: task 1: Killed\nsrun: error: Node failure on node2\n")
    (tmp_path / "rank0.out").write_text(json.dumps(PEER) + "\n")
    (tmp_path / "rank0.err").write_text("")
    (tmp_path / "rank1.err").write_text("W0000 a warning\nTraceback\nValueError: x\n")
    offsets = {str(tmp_path / "srun.err"): offset}
    return LogFiles(tmp_path, srun_err=tmp_path / "srun.err", offsets=offsets)


def test_the_edge_reads_only_this_attempt(tmp_path: Path) -> None:
    found = read_attempt(137, logs(tmp_path))
    assert [e.ranks for e in found.endings] == [(1,)]
    assert found.failed_nodes == ("node2",)
    assert found.lost_nodes() == ("node2",)
    assert found.errors[1] == "ValueError: x"


def test_the_edge_probes_lost_nodes_records_and_prints_shell(tmp_path: Path) -> None:
    probed: list[list[str]] = []

    def runner(args: Any, **_: Any) -> str:
        probed.append(list(args))
        raise SlurmCommandError("srun", 1, "node2 does not answer")

    step = Step("77", 137, 3, nodes=Nodes(("node1", "node2", "node3"), (), 2))
    out, _ = decide_and_record(step, logs(tmp_path), runner)
    assert (out.action, out.exclude) == ("restart", ("node2",))
    assert ["sinfo" in a for a in probed] == [True, False]  # drained? then the probe
    assert "--nodelist=node2" in probed[1]
    (record,) = read_record(tmp_path, "77")
    assert (record["action"], record["exclude"]) == ("restart", ["node2"])


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("Traceback\nValueError: bad shape (3, 4)\nW0000 x", "ValueError: bad shape (3, 4)"),
        ("train.py: --x='7': no. HINT: use 8", "train.py: --x='7': no. HINT: use 8"),
        ("usage: x\nW0000 warn", "usage: x"),
        ("ModuleNotFoundError: No module named 'tensorflow'", "python3 on the nodes has no"),
    ],
)
def test_a_ranks_own_error_line(text: str, line: str) -> None:
    assert line in own_error(text)


@pytest.mark.parametrize(
    ("code", "words", "sig"),
    [(0, "Exited with exit code 0", None), (3, "Exited with exit code 3", None),
     (137, "Exited with exit code 137", "SIGKILL"), (-9, "Killed", "SIGKILL"),
     (-11, "Segmentation", "SIGSEGV"), (-15, "Terminated", "SIGTERM"),
     (-40, "Ended by signal 40", "a signal (Ended by signal 40)")],
)  # fmt: skip
def test_srun_words_for_a_return_code_read_back_as_srun_said_them(
    code: int, words: str, sig: str | None
) -> None:
    """--cluster=local writes these for its ranks; the same reader classifies them."""
    assert srun_words(code) == words
    assert ending(f"task 1: {words}").signal == sig


def test_on_this_machine_a_preemption_restarts_in_place_without_probes(tmp_path: Path) -> None:
    files = logs(tmp_path)  # a lost peer on node2, srun's "Node failure on node2"

    def no_probe(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("probed a node on this machine")

    step = Step("9", 75, 3, on_this_machine=True)
    decision, line = decide_and_record(step, files, no_probe)
    assert (decision.action, decision.restart) == ("restart", 1)
    assert line.endswith(" s after preemption (checkpoint saved)"), line
    assert line.startswith("restart 1 in place (1 of 3 without progress, MAX_RESTARTS), ")
    killed = Step("9", 137, 3, on_this_machine=True)
    decision, line = decide_and_record(killed, files, no_probe)
    assert (decision.action, decision.exclude) == ("restart", ())  # no node left out
    assert "after rank 1 was killed by SIGKILL" in line
    assert [r["action"] for r in read_record(tmp_path, "9")] == ["restart", "restart"]


# srun's stderr when node4's slurmd died as the step started (Slurm 22.05.8 on the sandbox:
# the daemon aborted with "malloc_consolidate(): invalid chunk size"); node3's rank 0 then
# failed in its TaskProlog as srun ended the step.
ZERO = "Zero Bytes were transmitted or received"
LAUNCH_FAILED = (
    f"srun: error: slurm_receive_msgs: [[localhost]:8681] failed: {ZERO}\n"
    f"srun: error: Task launch for StepId=177154.1 failed on node node4: {ZERO}\n"
    f"srun: error: Application launch failed: {ZERO}\n"
    "srun: Job step aborted: Waiting up to 7 seconds for job step to finish.\n"
    "slurmstepd-node3: error: TaskProlog failed status=1\n"
    "srun: error: node3: task 0: Exited with exit code 1\n"
    "srun: error: node3: tasks 1-3: Terminated\n"
)


def _launch_failed(tmp_path: Path) -> LogFiles:
    (tmp_path / "srun.err").write_text(LAUNCH_FAILED)
    for rank in range(8):
        (tmp_path / f"rank{rank}.out").write_text("")
        (tmp_path / f"rank{rank}.err").write_text("")
    return LogFiles(tmp_path, srun_err=tmp_path / "srun.err")


def test_a_step_srun_could_not_launch_is_read_as_its_nodes_failure(tmp_path: Path) -> None:
    found = read_attempt(1, _launch_failed(tmp_path))
    assert found.launch_failed == ("node4",)
    assert found.lost_nodes() == ("node4",)  # probed before the decision
    assert classify(found) == ("srun could not launch the step's tasks on node4", True)


@pytest.mark.parametrize(("answers", "exclude"), [(False, ("node4",)), (True, ())])
def test_a_launch_failure_restarts_without_the_node_only_when_it_is_silent(
    tmp_path: Path, answers: bool, exclude: tuple[str, ...]
) -> None:
    """Before, rank 0's TaskProlog exit read as its own error and the job stopped."""
    probed: list[str] = []

    def runner(args: Any, **_: Any) -> str:
        if args[0] == "srun":
            probed.append(next(a for a in args if a.startswith("--nodelist=")))
            if not answers:
                raise SlurmCommandError("srun", 1, "node4 does not answer")
        return ""

    step = Step("5", 1, 3, nodes=Nodes(("node1", "node2", "node3", "node4"), (), 2))
    decision, line = decide_and_record(step, _launch_failed(tmp_path), runner)
    assert (decision.action, decision.exclude) == ("restart", exclude), line
    assert probed == ["--nodelist=node4"]
    assert "srun could not launch the step's tasks on node4" in line
