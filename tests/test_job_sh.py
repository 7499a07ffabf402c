"""slurmtf/job.sh, the shared part of the batch scripts: what a failed attempt leads to.

Each case writes the logs an attempt leaves (srun's own messages, each rank's stderr and
event lines), sources the real script in bash and runs ``slurmtf_decide`` (the real
``slurmtf recovery``) with a fake ``srun`` that probes nodes; then ``slurmtf_job_end``
with a recording ``scontrol`` and a fake step. No Slurm, no TensorFlow.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

JOB_SH = Path(__file__).resolve().parents[1] / "slurmtf" / "job.sh"
PEER = json.dumps({"event": "peer_lost", "rank": 0, "lost": [{"rank": 1, "node": "node2"}]})
HEARTBEAT = json.dumps(
    {"event": "peer_lost", "rank": 0, "lost": [{"rank": 1, "node": "node2"}], "heartbeat": True}
)
STALL = json.dumps({"event": "stalled", "message": "no training step finished for 31 s"})
TRACE = "Traceback (most recent call last):\n  File x\nValueError: bad shape (3, 4)"


def write_logs(tmp_path: Path, srun: str, ranks: dict[int, str], dead: str = "") -> Path:
    """The attempt's logs (event lines to rank N.out, other text to rank N.err) and a fake
    ``srun`` on PATH whose node probe fails for ``dead``."""
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "srun.err").write_text(srun)
    for rank, text in ranks.items():
        lines = text.splitlines()
        events = [x for x in lines if x.startswith("{")]
        (logs / f"rank{rank}.out").write_text("".join(x + "\n" for x in events))
        (logs / f"rank{rank}.err").write_text("\n".join(x for x in lines if x not in events) + "\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "srun"
    fake.write_text(f'#!/bin/bash\n[[ " $* " != *" --nodelist={dead} "* ]] || [ -z "{dead}" ]\n')
    fake.chmod(0o755)
    return logs


def classify(
    tmp_path: Path,
    srun: str,
    ranks: dict[int, str],
    rc: int,
    dead: str = "",
) -> dict[str, str]:
    logs = write_logs(tmp_path, srun, ranks, dead)
    script = f"""
        source {JOB_SH}
        PATH={tmp_path / "bin"}:$PATH; LOG_DIR={logs}; SLURM_JOB_ID=7; PYTHON=python3
        slurmtf_budget=3
        declare -A slurmtf_offsets=()
        slurmtf_rc={rc}
        slurmtf_decide
        [[ "$slurmtf_action" = restart || "$slurmtf_action" = requeue ]] && echo retry=1 \
            || echo retry=0
        echo "bad=${{slurmtf_exclude//,/ }}"
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
    tmp_path: Path, path: str, ending: tuple[Any, ...]
) -> None:
    _name, word, status, stderr, retry, why = ending
    reported = word if path == "srun" and word else f"Exited with exit code {status}"
    srun = f"srun: error: node2: task 1: {reported}\nsrun: error: node1: task 0: Killed\n"
    got = classify(tmp_path, srun, {0: PEER, 1: stderr}, status, "")
    assert got["retry"] == retry, got
    assert why in got["why"], got
    assert "W0000" not in got["why"], got
    assert "tensorflow/core" not in got["why"], got


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_failed_attempt_is_classified(tmp_path: Path, case: tuple[Any, ...]) -> None:
    name, srun, ranks, rc, dead, retry, bad, why = case
    got = classify(tmp_path, srun, ranks, rc, dead)
    assert (got["retry"], got["bad"]) == (retry, bad), (name, got)
    assert why in got["why"], (name, got)


def end(
    tmp_path: Path, restarts: int, budget: str, srun: str, ranks: dict[int, str]
) -> tuple[int, str, str]:
    logs = write_logs(tmp_path, srun, ranks, dead="node2")
    calls = tmp_path / "calls"
    script = f"""
        source {JOB_SH}
        PATH={tmp_path / "bin"}:$PATH; PYTHON=python3
        LOG_DIR={logs}; SLURM_JOB_ID=77; slurmtf_restarts={restarts}; slurmtf_budget={budget}
        SLURM_JOB_NODELIST='node[1-2]'; SLURM_JOB_NUM_NODES=2
        declare -A slurmtf_offsets=()
        slurmtf_rc=1
        scontrol() {{ echo "$*" >> {calls}; [ "$1" != show ] || echo "ExcNodeList=(null)"; }}
        slurmtf_step=(fake_step)
        fake_step() {{ echo "step again: $* ${{slurmtf_exclude_args[*]}}" \
            "SLURM_RESTART_COUNT=$SLURM_RESTART_COUNT"; return 0; }}
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
    assert "not restarted: already restarted 3 time(s) (MAX_RESTARTS=3)" in out
    assert calls == ""


def test_a_killed_rank_restarts_the_step_in_place(tmp_path: Path) -> None:
    """Through the launcher (exit 137) as directly: a new step in the same allocation,
    the ranks told the attempt, no requeue; the restart is in the job's record."""
    srun = "srun: error: node2: task 1: Exited with exit code 137\n"
    status, out, calls = end(tmp_path, 0, "2", srun, {0: "", 1: WARNINGS})
    assert status == 0, out
    assert "restart 1 of 2 in place (MAX_RESTARTS), " in out, out
    assert "s after rank 1 was killed by SIGKILL" in out, out
    assert "step again:" in out, out
    assert "SLURM_RESTART_COUNT=1" in out, out
    assert calls == "", calls
    text = (tmp_path / "logs" / "recovery-77.jsonl").read_text()
    (record,) = [json.loads(x) for x in text.splitlines()]
    assert (record["action"], record["restart"]) == ("restart", 1), record


def test_restarts_in_place_count_against_the_budget_across_requeues(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "recovery-77.jsonl").write_text('{"action": "restart"}\n{"action": "restart"}\n')
    srun = "srun: error: node2: task 1: Killed\n"
    status, out, calls = end(tmp_path, 1, "3", srun, {})  # and Slurm requeued it once
    assert status == 1, out  # the failed attempt's status (the fake srun exited 1)
    assert "not restarted: already restarted 3 time(s) (MAX_RESTARTS=3)" in out, out
    assert calls == ""


def test_a_preempted_rank_that_srun_saw_first_is_a_preemption(tmp_path: Path) -> None:
    """One rank exits 75 a moment before the others; srun stops them (Terminated)."""
    srun = (
        "srun: error: node2: task 1: Exited with exit code 75\n"
        "srun: error: node1: task 0: Terminated\n"
    )
    status, out, calls = end(tmp_path, 0, "2", srun, {0: "", 1: ""})
    assert status == 0, out
    assert "preempted after saving a checkpoint: requeueing job 77" in out, out
    assert calls.splitlines()[0] == "requeue 77", calls


def test_a_model_error_is_not_retried(tmp_path: Path) -> None:
    status, out, calls = end(tmp_path, 0, "3", OWN_FIRST, {1: TRACE})
    assert status == 1, out
    assert "rank 1 failed with its own error" in out, out
    assert "not restarted" in out, out
    assert calls == ""


def check_first(
    tmp_path: Path, check_rc: int, outliers: list[str], restarts: int, nodes: str = "node[2-3]"
) -> tuple[int, str, str]:
    """``slurmtf_check_first`` with a fake ``slurmtf check`` (writes its JSON verdict)."""
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    fake = tmp_path / "fakepy"
    verdict = json.dumps({"outliers": [{"node": n} for n in outliers]})
    fake.write_text(
        "#!/bin/bash\n"
        'if [ "$1 $2 $3" = "-m slurmtf.cli check" ]; then\n'
        f"  json=${{4#--json=}}; [ {check_rc} -eq 2 ] || echo '{verdict}' > \"$json\"\n"
        f"  exit {check_rc}\nfi\n"
        'exec python3 "$@"\n'
    )
    fake.chmod(0o755)
    script = f"""
        source {JOB_SH}
        LOG_DIR={logs}; SLURM_JOB_ID=77; slurmtf_restarts={restarts}; slurmtf_budget=2
        CHECK_FIRST=1; PYTHON={fake}; SLURM_JOB_NODELIST='{nodes}'; MIN_NODES=2
        scontrol() {{ echo "$*" >> {calls}; [ "$1" != show ] || echo "ExcNodeList=(null)"; }}
        slurmtf_check_first
        echo training
    """
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)
    recorded = calls.read_text() if calls.exists() else ""
    return done.returncode, done.stdout + done.stderr, recorded


def test_check_first_leaves_the_outlier_out_in_place_with_a_spare(tmp_path: Path) -> None:
    status, out, calls = check_first(tmp_path, 1, ["node3"], restarts=0, nodes="node[1-3]")
    assert status == 0, out
    assert "training" in out.splitlines(), out
    assert "restart 1 of 2 in place (MAX_RESTARTS) after check_first found outlier" in out, out
    assert "node3 left out" in out, out
    assert calls == ""


def test_check_first_requeues_without_the_outlier_node(tmp_path: Path) -> None:
    status, out, calls = check_first(tmp_path, 1, ["node3"], restarts=0)
    assert status == 0, out
    assert "training" not in out.splitlines()
    assert "check_first: outlier node(s) node3" in out
    assert "outlier node(s) node3: requeueing job 77 (restart 1 of 2, MAX_RESTARTS)" in out
    assert calls.splitlines() == ["requeue 77", "show job 77", "update JobId=77 ExcNodeList=node3"]


def test_check_first_stops_when_the_budget_is_spent(tmp_path: Path) -> None:
    status, out, calls = check_first(tmp_path, 1, ["node2", "node4"], restarts=2)
    assert status == 1, out
    assert "outlier node(s) node2,node4" in out
    assert "not training on an outlier node (MAX_RESTARTS=2 spent)" in out
    assert calls == ""


@pytest.mark.parametrize(("rc", "said"), [(0, None), (2, "the check did not run (exit 2)")])
def test_check_first_healthy_or_not_run_trains(tmp_path: Path, rc: int, said: str | None) -> None:
    status, out, calls = check_first(tmp_path, rc, [], restarts=0)
    assert status == 0, out
    assert "training" in out.splitlines(), out
    if said:
        assert said in out
    else:
        assert "check_first" not in out
    assert calls == ""


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
def test_workers_killed_while_the_chief_completes_are_tolerated(tmp_path: Path, srun: str) -> None:
    status, out, calls = end(tmp_path, 0, "3", srun, PS_RANKS)
    assert status == 0, out
    assert "tolerated the loss of worker " in out, out
    assert "rank 4 (SIGKILL)" in out.split("tolerated the loss of worker ")[1], out
    assert "requeue" not in out
    assert calls == ""


@pytest.mark.slow
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
    tmp_path: Path, srun: str, why: str
) -> None:
    status, out, calls = end(tmp_path, 0, "3", srun, PS_RANKS)
    assert status == 0, out
    assert "restart 1 of 3 in place (MAX_RESTARTS), " in out, out
    assert f" s after {why}" in out, out
    assert ("tolerated the loss of worker rank 4" in out) == ("task 4" in srun), out
    assert calls == "", calls


def test_a_chief_error_after_a_killed_worker_stops_the_job(tmp_path: Path) -> None:
    srun = (
        "srun: error: node3: task 4: Killed\nsrun: error: node1: task 0: Exited with exit code 1\n"
    )
    status, out, calls = end(tmp_path, 0, "3", srun, PS_RANKS)
    assert status == 1, out
    assert "tolerated the loss of worker rank 4 (SIGKILL); judging the attempt by" in out, out
    assert "rank 0 failed with its own error (exit code 1)" in out, out
    assert "requeue" not in calls, calls


def test_a_worker_that_exits_with_an_error_is_not_tolerated(tmp_path: Path) -> None:
    srun = "srun: error: node3: task 4: Exited with exit code 1\n"
    ranks = {**PS_RANKS, 4: PS_RANKS[4] + "\nslurmtf serve: the chief's server did not answer"}
    status, out, _ = end(tmp_path, 0, "3", srun, ranks)
    assert status == 1, out
    assert "tolerated" not in out
    assert "rank 4 failed with its own error (exit code 1)" in out, out
