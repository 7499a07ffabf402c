"""slurmtf/job.sh, the shared part of the batch scripts: what a failed attempt leads to.

Each case writes the logs an attempt leaves (srun's own messages, each rank's stderr),
sources the real script in bash and runs ``slurmtf_classify`` with a fake node probe;
then ``slurmtf_job_end`` with a recording ``scontrol``. No Slurm, no TensorFlow.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

JOB_SH = Path(__file__).resolve().parents[1] / "slurmtf" / "job.sh"
PEER = (
    "models.mnist: a peer failed, stalled or timed out - lost rank 1 (node2:12001) "
    "(UnavailableError): x. HINT: ... --heartbeat_timeout ..."
)
HEARTBEAT = "E0000 coordination_service.cc] Task /job:worker/replica:0/task:1 heartbeat timeout"
STALL = "models.mnist: no training step finished for 31 s on rank 0 (limit 30 s ...)"
TRACE = "Traceback (most recent call last):\n  File x\nValueError: bad shape (3, 4)"


def classify(
    tmp_path: Path,
    srun: str,
    ranks: dict[int, str],
    rc: int,
    dead: str = "",
) -> dict[str, str]:
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "srun.err").write_text(srun)
    for rank, text in ranks.items():
        (logs / f"rank{rank}.err").write_text(text + "\n")
    script = f"""
        source {JOB_SH}
        LOG_DIR={logs}
        declare -A slurmtf_offsets=()
        slurmtf_rc={rc}
        slurmtf_node_answers() {{ [ "$1" != "{dead}" ]; }}
        slurmtf_classify
        echo "retry=$slurmtf_retry"
        echo "bad=${{slurmtf_bad_nodes[*]}}"
        echo "why=$slurmtf_why"
    """
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    return dict(line.split("=", 1) for line in out.stdout.splitlines())


KILLED = "srun: error: node2: task 1: Killed\nsrun: error: node1: task 0: Exited with exit code 1\n"
PEER_FIRST = (
    "srun: error: node1: task 0: Exited with exit code 1\nsrun: error: Node failure on node2\n"
)
OWN_FIRST = (
    "srun: error: node2: task 1: Exited with exit code 1\nsrun: error: node1: task 0: Killed\n"
)


CASES = [
    ("rank killed", KILLED, {0: PEER, 1: ""}, 137, "", "1", "", "rank 1: Killed"),
    ("node dead", PEER_FIRST, {0: PEER}, 1, "node2", "1", "node2", "rank 0 lost a peer"),
    ("rank frozen", KILLED, {0: f"{HEARTBEAT}\n{PEER}"}, 137, "", "1", "node2", "rank 1"),
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
        "node failure only",
        "srun: error: Node failure on node2\n",
        {},
        1,
        "",
        "1",
        "",
        "Node failure on node2",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_failed_attempt_is_classified(tmp_path: Path, case: tuple[Any, ...]) -> None:
    name, srun, ranks, rc, dead, retry, bad, why = case
    got = classify(tmp_path, srun, ranks, rc, dead)
    assert (got["retry"], got["bad"]) == (retry, bad), (name, got)
    assert why in got["why"], (name, got)


def end(
    tmp_path: Path, restarts: int, budget: str, srun: str, ranks: dict[int, str]
) -> tuple[int, str, str]:
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "srun.err").write_text(srun)
    for rank, text in ranks.items():
        (logs / f"rank{rank}.err").write_text(text + "\n")
    calls = tmp_path / "calls"
    script = f"""
        source {JOB_SH}
        LOG_DIR={logs}; SLURM_JOB_ID=77; slurmtf_restarts={restarts}; slurmtf_budget={budget}
        declare -A slurmtf_offsets=()
        slurmtf_rc=1
        scontrol() {{ echo "$*" >> {calls}; [ "$1" != show ] || echo "ExcNodeList=(null)"; }}
        slurmtf_node_answers() {{ false; }}
        slurmtf_job_end
    """
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)
    recorded = calls.read_text() if calls.exists() else ""
    return done.returncode, done.stdout + done.stderr, recorded


def test_a_retryable_failure_requeues_and_excludes_the_dead_node(tmp_path: Path) -> None:
    status, out, calls = end(tmp_path, 0, "3", PEER_FIRST, {0: PEER})
    assert status == 0, out
    assert "requeueing job 77 (restart 1 of 3, MAX_RESTARTS)" in out
    assert calls.splitlines() == [
        "requeue 77",
        "show job 77",
        "update JobId=77 ExcNodeList=node2",
    ], calls


def test_the_budget_stops_restarts_and_says_so(tmp_path: Path) -> None:
    status, out, calls = end(tmp_path, 3, "3", PEER_FIRST, {0: PEER})
    assert status == 1, out
    assert "not requeued: already restarted 3 time(s) (MAX_RESTARTS=3)" in out
    assert calls == ""


def test_a_model_error_is_not_retried(tmp_path: Path) -> None:
    status, out, calls = end(tmp_path, 0, "3", OWN_FIRST, {1: TRACE})
    assert status == 1, out
    assert "rank 1 failed with its own error" in out, out
    assert "not requeued" in out, out
    assert calls == ""
