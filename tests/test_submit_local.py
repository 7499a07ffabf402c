"""--cluster=local: N local processes through the same launcher and resolver path."""

from __future__ import annotations

import io
import json
import re
import sys
import time
from pathlib import Path

import pytest

from slurmtf.cli import launch as launch_cli
from slurmtf.cli import submit as submit_cli
from slurmtf.errors import InputError
from slurmtf.local import job as local
from slurmtf.runtime.job.commands import rank_command
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.runtime.rank import launcher as launch
from slurmtf.spec import jobspec
from slurmtf.spec.jobspec import JobSpec

PRINT_CONFIG = (
    f"{sys.executable} -c \"import os; print('CFG', os.environ['TF_CONFIG'], "
    "os.environ['SLURM_RESTART_COUNT'])\""
)


def launch_events(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.startswith("{")]


def test_local_two_nodes_get_a_shared_cluster_and_distinct_ports(tmp_path: Path) -> None:
    out = io.StringIO()
    argv = ["--cluster=local", "--nodes=2", f"--log_dir={tmp_path}", f"--command={PRINT_CONFIG}"]
    assert submit_cli.main(argv, out=out) == 0
    logs = sorted(tmp_path.glob("*_log.out"))
    assert len(logs) == 2
    configs = []
    for rank, path in enumerate(logs):
        line = next(x for x in path.read_text().splitlines() if x.startswith("CFG "))
        config = json.loads(line.removeprefix("CFG ").rsplit(" ", 1)[0])
        assert config["task"] == {"type": "worker", "index": rank}
        configs.append(config["cluster"]["worker"])
    assert configs[0] == configs[1]
    assert len({w.split(":")[1] for w in configs[0]}) == 2
    assert "finished with exit status 0" in out.getvalue()


def test_local_sweep_runs_every_point(tmp_path: Path) -> None:
    out = io.StringIO()
    argv = ["--cluster=local", f"--log_dir={tmp_path}", "--command=true", "--sweep=a=1,2"]
    assert submit_cli.main(argv, out=out) == 0
    params = [launch_events(p)[0]["params"] for p in sorted(tmp_path.glob("*_*_0_log.out"))]
    assert params == [{"a": "1"}, {"a": "2"}]


@pytest.mark.slow
def test_local_preempted_run_restarts_up_to_max_requeues(tmp_path: Path) -> None:
    out = io.StringIO()
    command = f"{sys.executable} -c 'raise SystemExit(75)'"
    argv = ["--cluster=local", f"--log_dir={tmp_path}", f"--command={command}", "--max_requeues=2"]
    assert submit_cli.main(argv, out=out) == 75
    (log,) = tmp_path.glob("*_0_log.out")
    restarts = [e["restart_count"] for e in launch_events(log) if e["event"] == "launch"]
    assert restarts == [0, 1, 2]
    assert out.getvalue().count("without progress, MAX_RESTARTS) after preemption") == 2
    assert (
        "not restarted: already restarted 2 time(s) in a row without progress (MAX_RESTARTS=2)"
        in out.getvalue()
    )


def test_local_failed_rank_stops_the_others(tmp_path: Path) -> None:
    spec = JobSpec(
        kind="command",
        target="bash -c 'if [ $SLURM_PROCID = 1 ]; then exit 4; fi; sleep 60'",
        nodes=2,
        log_dir=str(tmp_path),
        cluster="local",
    )
    start = time.monotonic()
    assert local.run_local(spec, io.StringIO()) == 4
    assert time.monotonic() - start < 30


def test_function_kind_calls_module_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "userjob.py").write_text(
        "def train(argv):\n    return 0 if argv == ['--x=1', '--lr=2'] else 9\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert launch.call_function("userjob:train", ["--x=1", "--lr=2"]) == 0
    assert launch_cli.main(["--call", "userjob:train", "--", "--x=1", "--lr=2"]) == 0
    assert launch_cli.main(["--call", "userjob:train", "--", "--x=2"]) == 9


def test_a_bad_restart_count_is_one_line_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    """The per-task launcher reads SLURM_PROCID/SLURM_RESTART_COUNT through the resolver."""
    spec = JobSpec(kind="command", target="true")
    env = {"SLURM_JOB_ID": "9", "SLURM_PROCID": "0", "SLURM_RESTART_COUNT": "x"}
    with pytest.raises(InputError, match="SLURM_RESTART_COUNT='x'"):
        launch.run_task(spec, {}, env)


@pytest.mark.parametrize(
    ("supervised", "status"),
    [
        ({"SLURMTF_SUPERVISED": "1"}, 0),
        ({"SLURMTF_JOB_SH": "1"}, 0),  # the former name, set by jobs submitted before it
        ({"SLURMTF_SUPERVISED": "0", "SLURMTF_JOB_SH": "1"}, 75),  # the new name wins
        ({}, 75),
    ],
)
def test_a_preempted_rank_never_requeues_behind_the_supervisors_back(
    supervised: dict[str, str], status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """One budget, one decision: the supervisor decides when it runs the step (every task
    returns 0 so that srun stops no one); without it the task exits 75 and nothing is
    requeued."""
    spec = JobSpec(kind="command", target="bash -c 'exit 75'", max_requeues=2)
    env = {"SLURM_JOB_ID": "9", "SLURM_PROCID": "0", "PATH": "/usr/bin:/bin", **supervised}
    assert launch.run_task(spec, {}, env) == status
    events = [json.loads(line)["event"] for line in capsys.readouterr().out.splitlines()]
    assert "requeue" not in events


def test_the_supervisor_tells_a_submitted_jobs_ranks_it_decides_after_exit_75() -> None:
    """The step of a job ``slurmtf submit`` wrote gets ``SLURMTF_SUPERVISED=1``, the name
    the launcher reads first."""
    job = JobSettings.read("submitit", {"SLURMTF_REPO": "/nowhere"})
    command = rank_command(job, ["/p/python", "-u", "-m", "submitit.core._submit", "/l"])
    assert command.env == {"SLURMTF_SUPERVISED": "1"}
    assert launch.supervised(command.env)


def test_the_chief_of_a_ps_job_writes_its_done_file_however_its_script_ends(
    tmp_path: Path,
) -> None:
    """``submit --jobs``: the servers stop on this file even when the chief's script failed
    before its server answered (slurmtf serve --done_file)."""
    spec = JobSpec(kind="command", target="bash -c 'exit 3'", nodes=2, jobs="chief:1,worker:1",
                   log_dir=str(tmp_path))  # fmt: skip
    env = {"SLURM_JOB_ID": "9", "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
           "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
           "SLURM_RESTART_COUNT": "2", "SLURMD_NODENAME": "node1", "SLURMTF_JOBS": spec.jobs,
           "PATH": "/usr/bin:/bin"}  # fmt: skip
    done = jobspec.chief_done_file(spec, "9", 2)
    assert f"--done_file={done}" in jobspec.task_command(spec, {}, job_id="9", restart=2)
    assert not done.exists()
    assert launch.run_task(spec, {}, env) == 3  # the chief's script failed at once
    assert done.exists()


RANK_ENDING = Path(__file__).parent / "scripts" / "rank_ending.py"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ending", "status", "said"),
    [
        ("kill", 0, r", \d+\.\d s after rank 1 was killed by SIGKILL"),
        ("segv", 0, r", \d+\.\d s after rank 1 was killed by SIGSEGV"),
        ("preempt", 0, r" after preemption \(checkpoint saved\)"),
        ("raise", 1, "rank 1 failed with its own error .*RuntimeError: rank 1 broke on purpose"),
        ("exit2", 2, r"bad flags or settings \(exit 2\)"),
    ],
)
def test_local_restarts_a_killed_rank_in_place_as_the_job_scripts_do(
    tmp_path: Path, ending: str, status: int, said: str | None
) -> None:
    """The user's script through the launcher for unmodified scripts (``python SCRIPT``
    becomes ``python -m slurmtf.run SCRIPT``); a rank ended by a signal is restarted within
    the budget, an exception or exit 2 is not."""
    spec = JobSpec(
        kind="command",
        target=f"{sys.executable} {RANK_ENDING} --end={ending}",
        nodes=2,
        log_dir=str(tmp_path),
        cluster="local",
        max_requeues=1,
    )
    out = io.StringIO()
    assert local.run_local(spec, out) == status, out.getvalue()
    restarts = out.getvalue().count(
        "slurmtf: restart 1 in place (1 of 1 without progress, MAX_RESTARTS)"
    )
    assert restarts == (1 if status == 0 else 0), out.getvalue()
    assert re.search(said, out.getvalue()), out.getvalue()
    (record,) = tmp_path.glob("recovery-*.jsonl")
    actions = [json.loads(x)["action"] for x in record.read_text().splitlines()]
    assert actions == (["restart"] if status == 0 else ["stop"])
    (rank1,) = tmp_path.glob("*_1_log.out")
    launches = [e for e in launch_events(rank1) if e["event"] == "launch"]
    assert launches[0]["command"][1:4] == ["-m", "slurmtf.run", str(RANK_ENDING)]


PEER_LOST_ONCE = (
    "bash -c 'if [ $SLURM_RESTART_COUNT = 0 ] && [ $SLURM_PROCID = 0 ]; then "
    'echo {\\"event\\": \\"peer_lost\\", \\"lost\\": [{\\"rank\\": 1}]}; exit 1; fi; '
    "if [ $SLURM_RESTART_COUNT = 0 ]; then sleep 60; fi'"
)


def test_a_lost_peer_restarts_the_local_ranks_in_place(tmp_path: Path) -> None:
    """Rank 0's ``peer_lost`` event (not its words) makes its exit 1 a restart."""
    spec = JobSpec(kind="command", target=PEER_LOST_ONCE, nodes=2, log_dir=str(tmp_path),
                   cluster="local", max_requeues=3)  # fmt: skip
    out = io.StringIO()
    assert local.run_local(spec, out) == 0, out.getvalue()
    assert "restart 1 in place (1 of 3 without progress, MAX_RESTARTS)" in out.getvalue()
    assert "after rank 0 lost a peer or saw a stall" in out.getvalue()


def test_a_failed_step_leaves_no_process_of_its_ranks(tmp_path: Path) -> None:
    """Every rank's process group is killed (the launcher and the user's process under
    it), as srun ends a step: a restarted attempt never meets the last one's ranks."""
    pids = tmp_path / "pids"
    target = (
        f"bash -c 'echo $$ >> {pids}; if [ $SLURM_PROCID = 1 ]; then sleep 1; exit 3; fi; sleep 60'"
    )
    spec = JobSpec(kind="command", target=target, nodes=2, log_dir=str(tmp_path),
                   cluster="local")  # fmt: skip
    assert local.run_local(spec, io.StringIO()) == 3
    deadline = time.monotonic() + 10  # SIGKILL is sent; the kernel ends them soon after
    alive = pids.read_text().split()
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _state(int(p)) not in ("gone", "Z")]
        time.sleep(0.1)
    assert not alive, [_state(int(p)) for p in alive]
    (srun_err,) = tmp_path.glob("*_srun.err")
    assert srun_err.read_text() == "task 1: Exited with exit code 3\n"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_the_budget_is_one_across_local_restarts(tmp_path: Path) -> None:
    """A rank killed on every attempt: MAX_RESTARTS restarts in place, then the stop line."""
    target = "bash -c 'if [ $SLURM_PROCID = 1 ]; then kill -9 $$; fi; sleep 60'"
    spec = JobSpec(kind="command", target=target, nodes=2, log_dir=str(tmp_path),
                   cluster="local", max_requeues=2)  # fmt: skip
    out = io.StringIO()
    assert local.run_local(spec, out) == 137, out.getvalue()
    assert out.getvalue().count(" without progress, MAX_RESTARTS)") == 2
    assert (
        "not restarted: already restarted 2 time(s) in a row without progress (MAX_RESTARTS=2)"
        in out.getvalue()
    )
