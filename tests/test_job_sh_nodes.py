"""The supervisor with spare nodes and a node that stops answering mid-step, started as a
script of one's own starts it: through slurmtf/job.sh's compatibility functions.

Fake ``srun``/``squeue``/``scancel``/``scontrol`` on PATH stand in for Slurm; the real
job.sh runs in bash and hands the job to the real supervisor (``slurmtf job command``).
No Slurm, no TF; a hung probe or step makes each case take seconds (the slow tier).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
JOB_SH = REPO / "slurmtf" / "job.sh"

pytestmark = pytest.mark.slow

# The training step: in the first, rank 0 on node1 reports node2 lost (a `peer_lost` event on
# its stdout and in its node's file, SLURMTF_NODE_EVENTS with %N for the node, as ranks do); with
# node2 in $DEAD srun then hangs, as it waits for a frozen node. Later steps end at once.
# A probe (--overlap --nodes=1) of a node in $DEAD hangs; any other node answers.
FAKE_SRUN = """#!/bin/bash
echo "$*" >> "$CALLS"
case " $* " in
  *" --overlap --nodes=1 --ntasks=1 "*)
    for n in $DEAD; do [[ " $* " == *"--nodelist=$n "* ]] && exec sleep 30; done
    exit 0 ;;
esac
steps=$(grep -c -- "%t" "$CALLS")
if [ "$steps" -eq 1 ]; then
  lost='{"event": "peer_lost", "rank": 0, "lost": [{"rank": 1, "node": "node2"}]}'
  echo "$lost" >> "$LOG_DIR/rank0.out"
  echo "$lost" >> "${SLURMTF_NODE_EVENTS//%N/node1}"
  echo "srun: error: node1: task 0: Exited with exit code 1" >&2
  if [ -n "$DEAD" ]; then
    for fd in /proc/$$/fd/*; do [ "${fd##*/}" -gt 2 ] && eval "exec ${fd##*/}>&-"; done
    sleep 30 </dev/null >/dev/null 2>&1
  fi
  exit 1
fi
exit 0
"""
FAKES = {
    "srun": FAKE_SRUN,
    "squeue": '#!/bin/bash\necho "$SLURM_JOB_ID.batch"\necho "$SLURM_JOB_ID.0"\n',
    "scancel": '#!/bin/bash\necho "scancel $*" >> "$CALLS"\n',
    "scontrol": '#!/bin/bash\necho "scontrol $*" >> "$CALLS"\n',
}


def run_job(
    tmp_path: Path, dead: str = "node2", fakes: dict[str, str] | None = None, **env: str
) -> tuple[str, str, int]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in {**FAKES, **(fakes or {})}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "rank0.out").write_text("")
    run_env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls"),
        "LOG_DIR": str(logs), "DEAD": dead, "MAX_RESTARTS": "3",
        "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_JOB_NUM_NODES": "3",
        "SLURMTF_NODE_PROBE_S": "1", "SLURMTF_NODE_WATCH_S": "0.2",
        "PYTHON": sys.executable, "PYTHONPATH": str(REPO), "MODEL_DIR": str(tmp_path / "m"),
        "XDG_STATE_HOME": str(tmp_path / "state"), **env,
    }  # fmt: skip
    script = f"""
        source {JOB_SH}
        slurmtf_job_setup test >/dev/null
        slurmtf_job_srun train
        slurmtf_job_end
    """
    done = subprocess.run(
        ["bash", "-c", script], env=run_env, capture_output=True, text=True, timeout=90,
        check=False,
    )  # fmt: skip
    calls = (tmp_path / "calls").read_text() if (tmp_path / "calls").exists() else ""
    return done.stdout + done.stderr, calls, done.returncode


def steps(calls: str) -> list[str]:
    return [line for line in calls.splitlines() if "%t" in line]


def test_spares_idle_and_the_first_nodes_train(tmp_path: Path) -> None:
    _out, calls, _status = run_job(tmp_path, dead="", SPARE_NODES="1")
    first = steps(calls)[0]
    assert "--nodes=2 --ntasks-per-node=1 --ntasks=2" in first, calls
    assert "--nodelist=node1,node2" in first, calls


@pytest.mark.parametrize(
    ("env", "placement"),
    [
        ({"SPARE_NODES": "1"}, "node2 left out, training on a spare (node3)"),
        ({"MIN_NODES": "2"}, "node2 left out, training on the 2 node(s) left (minimum 2)"),
    ],
    ids=["spare", "range"],
)
def test_a_silent_node_ends_the_step_and_the_next_runs_without_it(
    tmp_path: Path, env: dict[str, str], placement: str
) -> None:
    out, calls, status = run_job(tmp_path, **env)
    assert "node(s) node2 stopped answering: ending the step" in out
    assert "scancel 7.0" in calls
    assert "restart 1 in place (1 of 3 without progress, MAX_RESTARTS)" in out
    assert placement in out
    again = steps(calls)[1]
    assert "--nodes=2 --ntasks-per-node=1 --ntasks=2" in again
    assert "--overlap --exclude=node2 --nodelist=node1,node3" in again
    assert status == 0, out


def test_below_the_minimum_the_job_is_requeued_without_the_node(tmp_path: Path) -> None:
    out, calls, _status = run_job(tmp_path)
    assert len(steps(calls)) == 1
    assert "requeueing job 7" in out
    assert "scontrol requeue 7" in calls
    assert "ExcNodeList=node2" in calls


def test_a_lost_peer_on_a_node_that_answers_is_left_to_the_step(tmp_path: Path) -> None:
    out, calls, _status = run_job(tmp_path, dead="", SPARE_NODES="1")
    assert "stopped answering" not in out
    assert "scancel" not in calls
    assert "restart 1 in place (1 of 3 without progress, MAX_RESTARTS)" in out
    assert "--overlap" not in steps(calls)[1]
    assert "--nodelist=node1,node2" in steps(calls)[1]


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"SPARE_NODES": "3"}, "SPARE_NODES=3: leaves none of the job's 3 node(s)"),
        ({"SPARE_NODES": "x"}, "SPARE_NODES='x': is not a node count"),
        ({"MIN_NODES": "4"}, "MIN_NODES=4: must be 1..3"),
        ({"SLURMTF_MIN_NODES": "2"}, "SLURMTF_MIN_NODES='2': is not read"),
    ],
)
def test_bad_spares_or_minimum_stop_the_job_naming_the_variable(
    tmp_path: Path, env: dict[str, str], says: str
) -> None:
    out, calls, status = run_job(tmp_path, dead="", **env)
    assert status == 2, out
    assert says in out
    assert "HINT: " in out
    assert steps(calls) == []


SCONTROL_SLURM_TAKES_NODE2 = """#!/bin/bash
echo "scontrol $*" >> "$CALLS"
case "$1 $2" in
  "show config") echo "SlurmdTimeout           = 2 sec" ;;
  "show job") n=$(grep -c "^scontrol show job" "$CALLS")  # not recovery's -o show job
              [ "$n" -lt 3 ] && echo " NodeList=node[1-3] " || echo " NodeList=node[1,3] " ;;
  "show hostnames") [ "$3" = "node[1-3]" ] && printf 'node1\\nnode2\\nnode3\\n' \\
                    || printf 'node1\\nnode3\\n' ;;
esac
"""


def test_a_requeue_without_a_hung_node_waits_until_slurm_took_it_out(tmp_path: Path) -> None:
    # Slurm 22.05 gives a job requeued while the hung node holds its old step no GRES.
    out, calls, _ = run_job(tmp_path, fakes={"scontrol": SCONTROL_SLURM_TAKES_NODE2})
    assert "waiting for Slurm to take node(s) node2 out of the job" in out
    shows = [line for line in calls.splitlines() if line.startswith("scontrol show job")]
    requeue = calls.index("scontrol requeue 7")
    assert len(shows) >= 3, calls
    assert calls.index(shows[2]) < requeue, calls
