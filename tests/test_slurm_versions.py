"""Each difference between Slurm releases that slurmtf meets, pinned with what each release
really exports or prints (22.05.8: Debian 12; 25.11.7 and 26.05.3: SchedMD's source, and
the sandbox on a 26.05.3 build). docs/SLURM_VERSIONS.md lists them. No Slurm, no TF."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from slurmtf.cli import check as check_cli
from slurmtf.cluster.env import read_slurm_env
from slurmtf.cluster.step_flags import (
    CPUS_PER_TASK_VARS,
    chosen_gpu_binding,
    gpu_bind_flags,
    tres_count,
    whole_node_environ,
)
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.runtime.job.srun_flags import gpu_bind
from slurmtf.runtime.recovery.decision import Budget, decide
from slurmtf.runtime.recovery.endings import NODE_FAILURE_STATUS, Attempt, TaskEnding, tasks_status
from slurmtf.runtime.recovery.evidence import LogFiles, read_attempt
from slurmtf.runtime.recovery.node_choice import Nodes
from slurmtf.spec.jobspec import GPU_FLAGS, JobSpec, sbatch_parameters
from tests.conftest import FakeSlurmEnv

# The batch step's GPU and CPU variables of one job form, as each release exports them
# (measured on the sandbox: 22.05.8 Debian, 26.05.3 built from SchedMD's tag; 25.11.7
# exports the same names as 26.05.3, from the source: src/common/env.c).
FORMS: dict[str, dict[str, dict[str, str]]] = {
    "--gres=gpu:2": {
        "22.05": {"SLURM_GPUS_ON_NODE": "2"},
        "25.11": {"SLURM_GPUS_ON_NODE": "2"},
        "26.05": {"SLURM_GPUS_ON_NODE": "2"},
    },
    "--gres=none --gpus-per-node=2": {
        "22.05": {"SLURM_GPUS_ON_NODE": "2", "SLURM_GPUS_PER_NODE": "2"},
        "25.11": {"SLURM_GPUS_ON_NODE": "2", "SLURM_GPUS_PER_NODE": "2"},
        "26.05": {"SLURM_GPUS_ON_NODE": "2", "SLURM_GPUS_PER_NODE": "2"},
    },
    "--gres=gpu:2 --gpu-bind=closest": {
        "22.05": {"SLURM_GPUS_ON_NODE": "2", "SLURM_GPU_BIND": "closest"},
        "25.11": {"SLURM_GPUS_ON_NODE": "2", "SLURM_TRES_BIND": "gres/gpu:closest"},
        "26.05": {"SLURM_GPUS_ON_NODE": "2", "SLURM_TRES_BIND": "gres/gpu:closest"},
    },
    "--gres=gpu:2 --gpu-bind=map_gpu:1,0": {
        "22.05": {"SLURM_GPUS_ON_NODE": "2", "SLURM_GPU_BIND": "map_gpu:1,0"},
        "25.11": {"SLURM_GPUS_ON_NODE": "2", "SLURM_TRES_BIND": "gres/gpu:map_gpu:1,0"},
        "26.05": {"SLURM_GPUS_ON_NODE": "2", "SLURM_TRES_BIND": "gres/gpu:map_gpu:1,0"},
    },
    "--gres=none --gpus-per-task=1 --ntasks-per-node=2": {
        "22.05": {"SLURM_GPUS_ON_NODE": "2", "SLURM_GPUS_PER_TASK": "1"},
        "25.11": {
            "SLURM_GPUS_ON_NODE": "2",
            "SLURM_TRES_PER_TASK": "gres/gpu=1",
            "SLURM_TRES_BIND": "gres/gpu:per_task:1",
        },
        "26.05": {
            "SLURM_GPUS_ON_NODE": "2",
            "SLURM_TRES_PER_TASK": "gres/gpu=1",
            "SLURM_TRES_BIND": "gres/gpu:per_task:1",
        },
    },
    "--gres=gpu:2 -c 2": {
        "22.05": {"SLURM_GPUS_ON_NODE": "2", "SLURM_CPUS_PER_TASK": "2"},
        "25.11": {
            "SLURM_GPUS_ON_NODE": "2",
            "SLURM_CPUS_PER_TASK": "2",
            "SLURM_TRES_PER_TASK": "cpu=2",
        },
        "26.05": {
            "SLURM_GPUS_ON_NODE": "2",
            "SLURM_CPUS_PER_TASK": "2",
            "SLURM_TRES_PER_TASK": "cpu=2",
        },
    },
}
# Whether the job chose its GPU binding itself (then slurmtf adds none).
CHOSEN = {
    "--gres=gpu:2": False,
    "--gres=none --gpus-per-node=2": False,
    "--gres=gpu:2 --gpu-bind=closest": True,
    "--gres=gpu:2 --gpu-bind=map_gpu:1,0": True,
    "--gres=none --gpus-per-task=1 --ntasks-per-node=2": True,
    "--gres=gpu:2 -c 2": False,  # cpu=2 in SLURM_TRES_PER_TASK is no GPU choice
}
VERSIONS = ("22.05", "25.11", "26.05")
CASES = [(form, version) for form in FORMS for version in VERSIONS]


@pytest.mark.parametrize(("form", "version"), CASES)
def test_the_gpu_binding_is_added_only_when_the_job_chose_none(
    form: str, version: str, fake_slurm_env: FakeSlurmEnv
) -> None:
    fake_slurm_env.set(**FORMS[form][version])
    env = read_slurm_env()
    assert (chosen_gpu_binding(env) is not None) == CHOSEN[form]
    expected = () if CHOSEN[form] else ("--gpu-bind=per_task:1",)
    assert gpu_bind_flags(env, tasks_per_node=2) == expected
    assert gpu_bind_flags(env, tasks_per_node=1) == ()  # one task keeps the node's GPUs


@pytest.mark.parametrize(("form", "version"), [(f, v) for f, v in CASES if v != "25.11"])
def test_the_supervisor_keeps_the_users_binding_on_every_release(form: str, version: str) -> None:
    """The supervisor adds --gpu-bind=per_task:1 for 2 tasks on 2 GPUs only when the job
    chose none (before, on 23.11+ it overrode --gpu-bind=closest)."""
    job = JobSettings.read("mnist", FORMS[form][version])
    expected = [] if CHOSEN[form] else ["--gpu-bind=per_task:1"]
    assert gpu_bind(job, "2") == expected


@pytest.mark.parametrize(
    ("text", "name", "count"),
    [
        ("gres/gpu=1", "gres/gpu", 1),
        ("gres/gpu:2", "gres/gpu", 2),
        ("cpu=2,gres/gpu=1", "gres/gpu", 1),
        ("cpu=2,gres/gpu:a100:1,gres/gpu:h100:2", "gres/gpu", 3),
        ("cpu=2", "gres/gpu", None),
        ("cpu=2", "cpu", 2),
        ("gres/gpu:1", "cpu", None),
        ("gres/gpus=1", "gres/gpu", None),  # another name
        ("", "gres/gpu", None),
        (None, "gres/gpu", None),
    ],
)
def test_tres_counts(text: str | None, name: str, count: int | None) -> None:
    assert tres_count(text, name) == count


# --- CPUs per task: steps inherit them from 23.11 (implying --exact) -----------------


@pytest.mark.parametrize(
    ("form", "version", "tres"),
    [
        ("--gres=gpu:2 -c 2", "22.05", None),
        ("--gres=gpu:2 -c 2", "26.05", None),  # cpu=2 only: gone
        ("--gres=none --gpus-per-task=1 --ntasks-per-node=2", "26.05", "gres/gpu=1"),
        ("--gres=gpu:2", "26.05", None),
    ],
)
def test_a_whole_node_step_runs_without_the_jobs_cpus_per_task(
    form: str, version: str, tres: str | None
) -> None:
    """Measured on the sandbox, a one-task-per-node step of a -c 2 job on 2-node, 4-CPU
    nodes: 22.05 gives it 8 CPUs (the nodes), 26.05.3 4 (2 a task, inherited), and 8
    again without SLURM_CPUS_PER_TASK and SLURM_TRES_PER_TASK's cpu=2."""
    environ = {"PATH": "/usr/bin", "SLURM_JOB_ID": "7", **FORMS[form][version]}
    env = whole_node_environ(environ)
    assert "SLURM_CPUS_PER_TASK" not in env
    assert env.get("SLURM_TRES_PER_TASK") == tres
    assert {k: v for k, v in env.items() if k not in CPUS_PER_TASK_VARS} == {
        k: v for k, v in environ.items() if k not in CPUS_PER_TASK_VARS
    }


def test_the_check_step_runs_without_the_jobs_cpus_per_task(
    fake_slurm_env: FakeSlurmEnv,
) -> None:
    fake_slurm_env.set(
        SLURM_JOB_ID=7, SLURM_JOB_NODELIST="node[1-2]", SLURM_JOB_CPUS_PER_NODE="8(x2)",
        **FORMS["--gres=gpu:2 -c 2"]["26.05"],
    )  # fmt: skip
    calls: list[tuple[list[str], Mapping[str, str] | None]] = []

    def runner(args: Sequence[str], env: Mapping[str, str] | None = None, **_: object) -> str:
        calls.append((list(args), env))
        return ""

    assert check_cli.main([], runner=runner) == 1  # no verdict printed: the check failed
    args, env = calls[-1]
    assert args[:4] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1"]
    assert env is not None
    assert env["SLURM_JOB_ID"] == "7"
    assert not {"SLURM_CPUS_PER_TASK", "SLURM_TRES_PER_TASK"} & set(env)


# --- GPU options each release accepts: 26.05 refuses --gres=gpu with --gpus-per-node -----


@pytest.mark.parametrize("flag", GPU_FLAGS)
def test_submit_asks_for_gpus_one_way_only(flag: str) -> None:
    """Slurm 26.05's sbatch refuses --gres=gpu:N beside --gpus-per-node (22.05 accepted
    both and its step then failed: 'Step requested gres_per_node=gpu:2 is more than the
    job's gres_per_node=gpu:1'): submit renders exactly one GPU request on every release."""
    spec = JobSpec(kind="model", target="mnist", nodes=2, gpus_per_node=2, gpu_flag=flag)
    params = sbatch_parameters(spec)
    asked = [k for k in ("gres", "gpus_per_node", "gpus_per_task") if k in params]
    assert len(asked) == 1, params
    extra = params["additional_parameters"]
    assert not {"gres", "gpus-per-node", "gpus-per-task"} & set(extra), extra


@pytest.mark.parametrize(
    ("extra", "bound"),
    [
        ((), True),
        ((("gpu-bind", "closest"),), False),
        ((("tres-bind", "gres/gpu:closest"),), False),  # 23.11+'s spelling
        ((("tres-per-task", "gres/gpu=1"),), False),
        ((("tres-per-task", "cpu=2"),), True),  # CPUs only: no GPU choice
    ],
)
def test_submit_keeps_the_users_gpu_binding(
    extra: tuple[tuple[str, str], ...], bound: bool
) -> None:
    spec = JobSpec(kind="model", target="mnist", nodes=2, gpus_per_node=2, sbatch_extra=extra)
    assert ("--gpu-bind=per_task:1" in sbatch_parameters(spec)["srun_args"]) == bound


# --- srun after a node failure: 22.05 exits with the tasks' status, 23.02+ exits 1 -----

SERVING = '{{"event": "serving", "rank": {rank}, "role": "{role}", "task_id": 0}}'
PS_EVENTS = {
    1: SERVING.format(role="ps", rank=1),
    3: SERVING.format(role="worker", rank=3),
    4: SERVING.format(role="worker", rank=4),
}
NODE3_FAILED = "srun: error: Node failure on node3\n"
# (srun's stderr, srun's status on 22.05, the decision's action and why)
NODE_FAILURES = {
    "a ps job's worker node failed, the chief completed": (
        NODE3_FAILED,
        0,
        ("done", "completed"),
    ),
    "a ps job's worker node failed, then the chief was killed": (
        NODE3_FAILED + "srun: error: node1: task 0: Killed\n",
        137,
        ("restart", "rank 0 was killed by SIGKILL"),
    ),
    "a ps job's worker node failed, the chief failed with its own error": (
        NODE3_FAILED + "srun: error: node1: task 0: Exited with exit code 3\n",
        3,
        ("stop", "failed: rank 0 failed with its own error (exit code 3): "),
    ),
}
# Measured on the sandbox: a 2-node step (srun --kill-on-bad-exit=0) of a --no-kill job
# whose node2 was set DOWN (scontrol update State=DOWN) 4 s in: Slurm ends the whole step.
MEASURED_NODE_DOWN = {
    "22.05": (
        "srun: error: Node failure on node2\nsrun: error: node1: task 0: Killed\n"
        "srun: Force Terminated StepId=886105.0\nsrun: error: node2: task 1: Killed\n",
        137,
    ),
    "26.05": (
        "srun: error: Node failure on node2\nsrun: error: node2: task 1: Killed\n"
        "srun: error: node1: task 0: Killed\nsrun: Force Terminated StepId=958157.0\n",
        1,
    ),
}


def _node_failure_attempt(tmp_path: Path, srun: str, status: int) -> Attempt:
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "srun.err").write_text(srun)
    for rank in range(5):
        (logs / f"rank{rank}.out").write_text(PS_EVENTS.get(rank, "") + "\n")
        (logs / f"rank{rank}.err").write_text("")
    return read_attempt(status, LogFiles(logs, srun_err=logs / "srun.err"))


@pytest.mark.parametrize("case", NODE_FAILURES)
@pytest.mark.parametrize("version", VERSIONS)
def test_a_node_failure_is_decided_the_same_on_every_release(
    case: str, version: str, tmp_path: Path
) -> None:
    srun, status_22_05, (action, why) = NODE_FAILURES[case]
    status = status_22_05 if version == "22.05" else NODE_FAILURE_STATUS  # 23.02+: 1
    attempt = _node_failure_attempt(tmp_path, srun, status)
    assert attempt.failed_nodes == ("node3",)
    decision = decide(attempt, Budget(0, 3), Nodes(("node1", "node2", "node3"), minimum=2))
    assert decision.action == action, decision
    assert decision.why.startswith(why), decision
    if action != "done":
        assert decision.status == (status_22_05 or 1)


@pytest.mark.parametrize(
    ("status", "endings", "failed", "expected"),
    [
        (1, [], ["node3"], 0),  # 23.02+: only the node failure -> the tasks' 0
        (0, [], ["node3"], 0),  # 22.05
        (1, [(2, False)], ["node3"], 2),
        (1, [(2, False), (137, True)], ["node3"], 137),  # a signal wins, as in srun
        (1, [(200, False), (137, True)], ["node3"], 137),
        (1, [(1, False)], ["node3"], 1),  # a task's own 1 explains it
        (1, [], [], 1),  # no node failure: srun's status as it is
        (137, [(137, True)], ["node3"], 137),
    ],
)
def test_tasks_status(
    status: int, endings: list[tuple[int, bool]], failed: list[str], expected: int
) -> None:
    assert tasks_status(status, endings, failed) == expected


@pytest.mark.parametrize(
    ("line", "status"),
    [
        ("srun: error: node1: task 0: Killed", (137, True)),
        ("srun: error: node1: task 0: Terminated", (143, True)),
        ("srun: error: node1: task 0: Exited with exit code 137", (137, False)),
        ("srun: error: node1: task 0: Exited with exit code 2", (2, False)),
        ("srun: error: node1: task 0: Out Of Memory", (1, False)),
    ],
)
def test_a_task_ending_as_srun_counts_it(line: str, status: tuple[int, bool]) -> None:
    ending = TaskEnding.parse(line)
    assert ending is not None
    assert ending.status == status


@pytest.mark.parametrize("version", MEASURED_NODE_DOWN)
def test_a_step_ended_by_a_node_going_down_restarts_in_place_on_both_releases(
    version: str, tmp_path: Path
) -> None:
    srun, status = MEASURED_NODE_DOWN[version]
    attempt = _node_failure_attempt(tmp_path, srun, status)
    assert attempt.failed_nodes == ("node2",)
    nodes = Nodes(("node1", "node2", "node3"), minimum=2, dead=("node2",))
    decision = decide(attempt, Budget(0, 3), nodes)
    assert decision.action == "restart", decision
    assert decision.status == 137  # 26.05's 1 read back as the tasks' SIGKILL
    assert decision.exclude == ("node2",)
