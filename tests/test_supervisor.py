"""The supervisor (slurmtf/runtime/job/supervisor.py): what a failed attempt leads to.

Each case runs the real supervisor in this process with a fake ``srun`` on PATH: its
first step writes the logs an attempt leaves (srun's own messages, each rank's stderr
and event lines) and exits with the attempt's status; a later step (a restart in place)
prints its arguments and exits 0. Slurm's other commands (node probes, scontrol, sinfo)
are answered by a fake runner that records them. No Slurm, no TensorFlow.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from slurmtf.errors import SlurmCommandError
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.runtime.job.supervisor import Supervisor

PEER = json.dumps({"event": "peer_lost", "rank": 0, "lost": [{"rank": 1, "node": "node2"}]})
HEARTBEAT = json.dumps(
    {"event": "peer_lost", "rank": 0, "lost": [{"rank": 1, "node": "node2"}], "heartbeat": True}
)
STALL = json.dumps({"event": "stalled", "message": "no training step finished for 31 s"})
TRACE = "Traceback (most recent call last):\n  File x\nValueError: bad shape (3, 4)"


FAKE_SRUN = """#!/bin/bash
if [ -e "$STEP_DONE" ]; then
    echo "step again: $* SLURM_RESTART_COUNT=$SLURM_RESTART_COUNT"
    exit 0
fi
touch "$STEP_DONE"
if [ -n "${NODE_EVENT:-}" ]; then  # a rank on node1 writes its node's file, the step runs on
    echo "$NODE_EVENT" >> "${SLURMTF_NODE_EVENTS//%N/node1}"
    exec sleep 30
fi
cat "$ATTEMPT/srun.err" >&2
for f in "$ATTEMPT"/rank*; do [ -e "$f" ] || continue; cat "$f" >> "$LOG_DIR/${f##*/}"; done
exit "$(cat "$ATTEMPT/rc")"
"""


class FakeRunner:
    """Slurm's commands other than the step: a probe (srun --overlap) of a node in
    ``dead`` fails; scontrol and sinfo answer as on a healthy cluster. Records calls."""

    def __init__(self, dead: Sequence[str] = (), submit_line: str = "") -> None:
        self.dead = set(dead)
        self.submit_line = submit_line  # scontrol -o show job's SubmitLine= (25.11+)
        self.calls: list[str] = []

    def __call__(self, args: Sequence[str], **_: object) -> str:
        line = shlex.join(args)
        if args[0] == "srun":
            if any(f"--nodelist={n}" in args for n in self.dead):
                raise SlurmCommandError(line, 1, "timed out")
            return ""
        self.calls.append(line)
        if args[:3] == ["scontrol", "show", "job"]:
            return "JobId=77 JobName=x\n   ExcNodeList=(null) NodeList=node1\n"
        if args[:4] == ["scontrol", "-o", "show", "job"] and self.submit_line:
            return f"JobId=77 SubmitLine={self.submit_line} WorkDir=/w\n"
        return ""


def attempt_files(tmp_path: Path, srun: str, ranks: dict[int, str], rc: int) -> Path:
    """What the fake step leaves: event lines to rank N.out, other text to rank N.err."""
    attempt = tmp_path / "attempt"
    attempt.mkdir(exist_ok=True)
    (attempt / "srun.err").write_text(srun)
    (attempt / "rc").write_text(str(rc))
    for rank, text in ranks.items():
        lines = text.splitlines()
        events = [x for x in lines if x.startswith("{")]
        (attempt / f"rank{rank}.out").write_text("".join(x + "\n" for x in events))
        (attempt / f"rank{rank}.err").write_text(
            "\n".join(x for x in lines if x not in events) + "\n"
        )
    return attempt


def supervise(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    srun: str,
    ranks: dict[int, str],
    rc: int = 1,
    *,
    dead: Sequence[str] = (),
    submit_line: str = "",
    restarts: int = 0,
    budget: str = "3",
    nodes: str = "node[1-2]",
    **env: str,
) -> tuple[int, str, FakeRunner]:
    """The supervisor over one failed attempt (and whatever follows): its status, its
    output, the Slurm commands it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    logs = tmp_path / "logs"
    environ = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "LOG_DIR": str(logs), "MODEL_DIR": str(tmp_path / "m"),
        "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": nodes, "SLURM_JOB_NUM_NODES": "2",
        "SLURM_RESTART_COUNT": str(restarts), "MAX_RESTARTS": budget, "PYTHON": sys.executable,
        "SLURMTF_NODE_WATCH_S": "0.05", "SLURMTF_NODE_PROBE_S": "1",
        "ATTEMPT": str(attempt_files(tmp_path, srun, ranks, rc)),
        "STEP_DONE": str(tmp_path / "step_done"), **env,
    }  # fmt: skip
    if not nodes:
        del environ["SLURM_JOB_NODELIST"]
    runner = FakeRunner(dead, submit_line)
    job = JobSettings.read("command", environ)
    status = Supervisor(job, ["train"], environ, runner).run(header=False)
    captured = capfd.readouterr()
    return status, captured.out + captured.err, runner


def record(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "logs" / "recovery-77.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def classify(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    srun: str,
    ranks: dict[int, str],
    rc: int,
    *,
    dead: str = "",
) -> dict[str, str]:
    """The first decision after the attempt: retried?, the nodes left out, and why."""
    _, out, _ = supervise(tmp_path, capfd, srun, ranks, rc, dead=[dead] if dead else [])
    first = record(tmp_path)[0] if record(tmp_path) else {"action": "done", "why": out}
    retry = "1" if first["action"] in ("restart", "requeue") else "0"
    return {"retry": retry, "bad": " ".join(first.get("exclude", [])), "why": first["why"] + out}


KILLED = "srun: error: node2: task 1: Killed\nsrun: error: node1: task 0: Exited with exit code 1\n"
PEER_FIRST = (
    "srun: error: node1: task 0: Exited with exit code 1\nsrun: error: Node failure on node2\n"
)
OWN_FIRST = (
    "srun: error: node2: task 1: Exited with exit code 1\nsrun: error: node1: task 0: Killed\n"
)


CASES = [
    ("rank killed", KILLED, {0: PEER, 1: ""}, 137, "", "1", "", "rank 1 was killed by SIGKILL"),
    ("node dead", PEER_FIRST, {0: PEER}, 1, "node2", "1", "node2", "rank 0 lost a peer"),
    # heartbeats stopped: its node is left out only when it does not answer a probe
    ("rank frozen", KILLED, {0: f"{HEARTBEAT}\n{PEER}"}, 137, "", "1", "", "rank 1"),
    ("node frozen", KILLED, {0: f"{HEARTBEAT}\n{PEER}"}, 137, "node2", "1", "node2", "node2"),
    ("stall", PEER_FIRST, {0: STALL}, 1, "", "1", "", "saw a stall"),
    ("model error", OWN_FIRST, {0: "", 1: TRACE}, 1, "", "0", "", "bad shape (3, 4)"),
    (
        "bad flags",
        "srun: error: node1: tasks 0-1: Exited with exit code 2\n",
        {},
        2,
        "",
        "0",
        "",
        "bad flags",
    ),
    ("plain exit", "", {0: "something"}, 1, "", "0", "", "without a lost peer"),
    (
        "node failure only",  # srun killed after it; exit 1 alone: test_slurm_versions
        "srun: error: Node failure on node2\n",
        {},
        137,
        "",
        "1",
        "",
        "Node failure on node2",
    ),
]


# How a rank ends x how srun hears of it: directly (jobs/*.sbatch run the model under srun)
# or through slurmtf submit's launcher, which exits 128+N for a child ended by signal N.
# Either way the same closing words and the same decision.
WARNINGS = (
    "W0000 00:00:1764070000.1 123 dataset.cc:997] Input of GeneratorDatasetOp::Dataset "
    "will not be optimized\n"
    "2026-11-25 13:00:00.123456: W tensorflow/core/x.cc:1] a warning\n"
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
)
ENDINGS = [
    # (ending, srun's word when the signal reached srun's task, the launcher's exit status,
    #  the rank's stderr, retried?, closing words)
    ("SIGKILL", "Killed", 137, WARNINGS, "1", "rank 1 was killed by SIGKILL"),
    ("SIGTERM", "Terminated", 143, WARNINGS, "1", "rank 1 was killed by SIGTERM"),
    ("SIGSEGV", "Segmentation fault (core dumped)", 139, "", "1", "rank 1 was killed by SIGSEGV"),
    ("SIGABRT", "Aborted", 134, "F0000 check failed", "1", "rank 1 was killed by SIGABRT"),
    (
        "exception",
        None,
        1,
        f"{TRACE}\n{WARNINGS}",
        "0",
        "rank 1 failed with its own error (exit code 1): ValueError: bad shape (3, 4)",
    ),
    (
        "slurmtf error",
        None,
        1,
        "train.py: --batch_size='7': does not divide. HINT: use 8\n" + WARNINGS,
        "0",
        "own error (exit code 1): train.py: --batch_size='7': does not divide. HINT: use 8",
    ),
    ("bad flags", None, 2, "usage: x", "0", "bad flags or settings (exit 2)"),
]


@pytest.mark.parametrize("path", ["srun", "launcher"])
@pytest.mark.parametrize("ending", ENDINGS, ids=[e[0] for e in ENDINGS])
def test_how_a_rank_ended_decides_not_who_reported_it(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], path: str, ending: tuple[Any, ...]
) -> None:
    _name, word, status, stderr, retry, why = ending
    reported = word if path == "srun" and word else f"Exited with exit code {status}"
    srun = f"srun: error: node2: task 1: {reported}\nsrun: error: node1: task 0: Killed\n"
    got = classify(tmp_path, capfd, srun, {0: PEER, 1: stderr}, status)
    assert got["retry"] == retry, got
    assert why in got["why"], got


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_failed_attempt_is_classified(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], case: tuple[Any, ...]
) -> None:
    name, srun, ranks, rc, dead, retry, bad, why = case
    got = classify(tmp_path, capfd, srun, ranks, rc, dead=dead)
    assert (got["retry"], got["bad"]) == (retry, bad), (name, got)
    assert why in got["why"], (name, got)


def scontrol(runner: FakeRunner) -> list[str]:
    """The scontrol calls about the job's queue state (requeue, its excluded nodes)."""
    keep = ("scontrol requeue", "scontrol show job", "scontrol update JobId=77 ExcNodeList")
    return [c for c in runner.calls if c.startswith(keep)]


def test_a_retryable_failure_requeues_and_excludes_the_dead_node(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    status, out, runner = supervise(tmp_path, capfd, PEER_FIRST, {0: PEER}, dead=["node2"])
    assert status == 0, out
    assert "requeueing job 77 (restart 1, 1 of 3 without progress, MAX_RESTARTS)" in out
    assert scontrol(runner)[-4:] == [
        "scontrol requeue 77",
        "scontrol show job 77",
        "scontrol update JobId=77 ExcNodeList=node2",
        "scontrol show job 77",  # why it waits, when Slurm says it cannot start
    ], runner.calls


def test_the_budget_stops_restarts_and_says_so(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    status, out, runner = supervise(tmp_path, capfd, PEER_FIRST, {0: PEER}, restarts=3)
    assert status == 1, out
    assert (
        "not restarted: already restarted 3 time(s) in a row without progress (MAX_RESTARTS=3)"
        in out
    )
    assert scontrol(runner) == []


def test_a_killed_rank_restarts_the_step_in_place(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Through the launcher (exit 137) as directly: a new step in the same allocation,
    the ranks told the attempt, no requeue; the restart is in the job's record."""
    srun = "srun: error: node2: task 1: Exited with exit code 137\n"
    status, out, runner = supervise(tmp_path, capfd, srun, {0: "", 1: WARNINGS}, budget="2")
    assert status == 0, out
    assert "restart 1 in place (1 of 2 without progress, MAX_RESTARTS), " in out, out
    assert "s after rank 1 was killed by SIGKILL" in out, out
    assert "step again:" in out, out
    assert "SLURM_RESTART_COUNT=1" in out, out
    assert "srun exited 1" in out, out
    assert "srun exited 0" in out, out
    assert scontrol(runner) == []
    (entry,) = record(tmp_path)
    assert (entry["action"], entry["restart"]) == ("restart", 1), entry


def test_restarts_in_place_count_against_the_budget_across_requeues(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "recovery-77.jsonl").write_text('{"action": "restart"}\n{"action": "restart"}\n')
    srun = "srun: error: node2: task 1: Killed\n"
    status, out, runner = supervise(tmp_path, capfd, srun, {}, restarts=1)  # Slurm requeued once
    assert status == 1, out  # the failed attempt's status (the fake srun exited 1)
    assert (
        "not restarted: already restarted 3 time(s) in a row without progress (MAX_RESTARTS=3)"
        in out
    ), out
    assert scontrol(runner) == []


def test_a_preempted_rank_that_srun_saw_first_is_a_preemption(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """One rank exits 75 a moment before the others; srun stops them (Terminated)."""
    srun = (
        "srun: error: node2: task 1: Exited with exit code 75\n"
        "srun: error: node1: task 0: Terminated\n"
    )
    status, out, runner = supervise(tmp_path, capfd, srun, {0: "", 1: ""}, budget="2")
    assert status == 0, out
    assert "preempted after saving a checkpoint: requeueing job 77" in out, out
    assert scontrol(runner)[0] == "scontrol requeue 77", runner.calls


def test_a_model_error_is_not_retried(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    status, out, runner = supervise(tmp_path, capfd, OWN_FIRST, {1: TRACE})
    assert status == 1, out
    assert "rank 1 failed with its own error" in out, out
    assert "not restarted" in out, out
    assert scontrol(runner) == []


def check_first(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    check_rc: int,
    outliers: list[str],
    *,
    restarts: int,
    nodes: str = "node[2-3]",
) -> tuple[int, str, list[str]]:
    """CHECK_FIRST=1 with a fake ``slurmtf check`` (writes its JSON verdict); the job then
    trains (the fake step completes) or not."""
    fake = tmp_path / "fakepy"
    verdict = json.dumps({"outliers": [{"node": n} for n in outliers]})
    fake.write_text(
        "#!/bin/bash\n"
        'if [ "$1 $2 $3" = "-m slurmtf.cli check" ]; then\n'
        f"  json=${{4#--json=}}; [ {check_rc} -eq 2 ] || echo '{verdict}' > \"$json\"\n"
        f"  exit {check_rc}\nfi\n"
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    from slurmtf.runtime.job import check_first

    original = check_first.CheckFirst.__init__

    def with_fake(self: check_first.CheckFirst, *args: Any) -> None:
        original(self, *args)
        self.python = str(fake)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(check_first.CheckFirst, "__init__", with_fake)
        status, out, runner = supervise(
            tmp_path, capfd, "", {}, 0, restarts=restarts, budget="2", nodes=nodes,
            CHECK_FIRST="1", MIN_NODES="2", SLURM_JOB_NUM_NODES=str(nodes.count(",") + 2),
        )  # fmt: skip
    trained = (tmp_path / "step_done").exists()
    return status, out + ("training\n" if trained else ""), scontrol(runner)


def test_check_first_leaves_the_outlier_out_in_place_with_a_spare(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    status, out, calls = check_first(tmp_path, capfd, 1, ["node3"], restarts=0, nodes="node[1-3]")
    assert status == 0, out
    assert "training" in out.splitlines(), out
    assert (
        "restart 1 in place (1 of 2 without progress, MAX_RESTARTS) after check_first found outlier"
        in out
    ), out
    assert "node3 left out" in out, out
    assert calls == []


def test_check_first_requeues_without_the_outlier_node(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    status, out, calls = check_first(tmp_path, capfd, 1, ["node3"], restarts=0)
    assert status == 0, out
    assert "training" not in out.splitlines()
    assert "check_first: outlier node(s) node3" in out
    assert (
        "outlier node(s) node3: requeueing job 77 (restart 1, 1 of 2 without progress, "
        "MAX_RESTARTS)" in out
    )
    assert calls == [
        "scontrol requeue 77",
        "scontrol show job 77",
        "scontrol update JobId=77 ExcNodeList=node3",
        "scontrol show job 77",
    ]


def test_check_first_stops_when_the_budget_is_spent(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    status, out, calls = check_first(tmp_path, capfd, 1, ["node2", "node4"], restarts=2)
    assert status == 1, out
    assert "outlier node(s) node2,node4" in out
    assert "not training on an outlier node (MAX_RESTARTS=2 spent)" in out
    assert calls == []


@pytest.mark.parametrize(("rc", "said"), [(0, None), (2, "the check did not run (exit 2)")])
def test_check_first_healthy_or_not_run_trains(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], rc: int, said: str | None
) -> None:
    status, out, calls = check_first(tmp_path, capfd, rc, [], restarts=0)
    assert status == 0, out
    assert "training" in out.splitlines(), out
    if said:
        assert said in out
    else:
        assert "check_first" not in out
    assert calls == []


# A parameter-server job (jobs/parameter_server.sbatch, submit --jobs): rank 0 the chief.
SERVING = '{{"event": "serving", "rank": {rank}, "role": "{role}", "task_id": 0}}'
PS_RANKS = {
    0: "",
    1: SERVING.format(role="ps", rank=1),
    3: SERVING.format(role="worker", rank=3),
    4: SERVING.format(role="worker", rank=4),
}


@pytest.mark.parametrize(
    "srun",
    [
        "srun: error: node3: task 4: Killed\n",
        "srun: error: node3: task 4: Exited with exit code 137\n",  # through slurmtf submit
        "srun: error: node3: task 4: Killed\nsrun: error: node2: task 3: Terminated\n",
        "srun: error: node2: tasks 3-4: Killed\n",  # srun's grouped form
    ],
)
def test_workers_killed_while_the_chief_completes_are_tolerated(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], srun: str
) -> None:
    status, out, runner = supervise(tmp_path, capfd, srun, PS_RANKS)
    assert status == 0, out
    assert "tolerated the loss of worker " in out, out
    assert "rank 4 (SIGKILL)" in out.split("tolerated the loss of worker ")[1], out
    assert "requeue" not in out
    assert scontrol(runner) == []


@pytest.mark.parametrize(
    ("srun", "why"),
    [
        ("srun: error: node1: task 1: Killed\n", "rank 1 was killed by SIGKILL"),  # a ps
        ("srun: error: node1: task 0: Killed\n", "rank 0 was killed by SIGKILL"),  # the chief
        (  # a worker and then the chief: judged by the chief's own ending
            "srun: error: node3: task 4: Killed\nsrun: error: node1: task 0: Killed\n",
            "rank 0 was killed by SIGKILL",
        ),
    ],
)
def test_a_ps_or_chief_failure_restarts_a_parameter_server_job_in_place(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], srun: str, why: str
) -> None:
    status, out, runner = supervise(tmp_path, capfd, srun, PS_RANKS)
    assert status == 0, out
    assert "restart 1 in place (1 of 3 without progress, MAX_RESTARTS), " in out, out
    assert f" s after {why}" in out, out
    assert ("tolerated the loss of worker rank 4" in out) == ("task 4" in srun), out
    assert scontrol(runner) == []


def test_a_chief_error_after_a_killed_worker_stops_the_job(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    srun = (
        "srun: error: node3: task 4: Killed\nsrun: error: node1: task 0: Exited with exit code 1\n"
    )
    status, out, runner = supervise(tmp_path, capfd, srun, PS_RANKS)
    assert status == 1, out
    assert "tolerated the loss of worker rank 4 (SIGKILL); judging the attempt by" in out, out
    assert "rank 0 failed with its own error (exit code 1)" in out, out
    assert scontrol(runner) == []


def test_a_worker_that_exits_with_an_error_is_not_tolerated(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    srun = "srun: error: node3: task 4: Exited with exit code 1\n"
    ranks = {**PS_RANKS, 4: PS_RANKS[4] + "\nslurmtf serve: the chief's server did not answer"}
    status, out, _ = supervise(tmp_path, capfd, srun, ranks)
    assert status == 1, out
    assert "tolerated" not in out
    assert "rank 4 failed with its own error (exit code 1)" in out, out


def test_a_range_job_goes_on_in_place_on_the_minimum_slurm_reports(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Without MIN_NODES, the range's minimum from scontrol's SubmitLine= (Slurm 25.11+):
    a 3-node job of a 2-3 range goes on in place on the 2 nodes left."""
    status, out, runner = supervise(
        tmp_path, capfd, PEER_FIRST, {0: PEER}, dead=["node2"], nodes="node[1-3]",
        submit_line="sbatch --nodes=2-3 jobs/mnist.sbatch", SLURM_JOB_NUM_NODES="3",
    )  # fmt: skip
    assert status == 0, out
    assert "node2 left out, training on the 2 node(s) left (minimum 2)" in out, out
    assert "--exclude=node2" in out, out
    assert scontrol(runner) == []


def test_the_look_reads_the_nodes_files_not_the_ranks(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the step runs, a rank of node1 appends ``peer_lost`` (node2) to node1's file:
    the supervisor probes node2, finds it silent and ends the step at once, reading only
    the nodes' files and srun's stderr at each look, never a rank's log."""
    from slurmtf.runtime.job import follow

    read: list[str] = []
    real = follow.read_from

    def recorded(path: Path, offset: int, limit: int = follow.MAX_READ) -> bytes:
        read.append(Path(path).name)
        return real(path, offset, limit)

    monkeypatch.setattr(follow, "read_from", recorded)
    ranks = dict.fromkeys(range(8), "")
    status, out, runner = supervise(tmp_path, capfd, "", ranks, 0, dead=["node2"],
                                    NODE_EVENT=HEARTBEAT)  # fmt: skip
    assert "node(s) node2 stopped answering: ending the step" in out
    assert "squeue -h -s -j 77 -o '%i %j'" in runner.calls  # the job's steps, to end them
    assert record(tmp_path)[0]["exclude"] == ["node2"]
    assert set(read) <= {"events-77-node1.jsonl", "events-77-node2.jsonl", "srun.err"}, read
    assert "events-77-node1.jsonl" in read
    assert status == 0  # the restart in place (the fake's next step) completed


def test_a_wide_job_looks_at_one_file_per_node() -> None:
    """64 nodes x 16 ranks: 64 files to follow, named for the nodes, not 1,024."""
    environ = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "node[1-64]", "LOG_DIR": "/l",
               "SLURM_JOB_NUM_NODES": "64", "SLURM_NTASKS": "1024"}  # fmt: skip
    job = JobSettings.read("train", environ)
    files = Supervisor(job, ["x.py"], environ, FakeRunner())._node_files()
    assert [f.name for f in files] == [f"events-5-node{n}.jsonl" for n in range(1, 65)]
    assert {f.parent for f in files} == {Path("/l")}
