"""Roles (SLURMTF_JOBS / resolve(jobs=...)): parsing, hand-out over ranks, TF_CONFIG, GPUs."""

from __future__ import annotations

import json

import pytest

from slurmtf.cluster.gpu_plan import node_shares, plan_gpus
from slurmtf.cluster.layout import ClusterLayout
from slurmtf.cluster.roles import JobEntry, parse_jobs, task_ids
from slurmtf.errors import InputError
from slurmtf.resolver import explain, export_lines, resolve
from tests.conftest import FakeSlurmEnv

step_vars = FakeSlurmEnv.step_vars


def roles_of(jobs: str, ntasks: int) -> list[str]:
    """Every rank's ``type:index``, as rank 0 resolves a ``ntasks``-task step."""
    env = step_vars(f"n[1-{ntasks}]", f"1(x{ntasks})", 0, SLURMTF_JOBS=jobs)
    layout = resolve(env)
    return [
        f"{role}:{index}"
        for role, index in zip(layout.roles or (), task_ids(layout.roles or ()), strict=True)
    ]


HAND_OUT = [
    ("chief:1,ps:2,worker:2", 5, ["chief:0", "ps:0", "ps:1", "worker:0", "worker:1"]),
    ("chief:1,ps:2,worker", 5, ["chief:0", "ps:0", "ps:1", "worker:0", "worker:1"]),
    ("chief:1,ps:1,worker", 3, ["chief:0", "ps:0", "worker:0"]),
    ("worker", 3, ["worker:0", "worker:1", "worker:2"]),
    ("worker:2,evaluator:1", 3, ["worker:0", "worker:1", "evaluator:0"]),
    ("chief:1,worker", 3, ["chief:0", "worker:0", "worker:1"]),
    (" chief:1 , ps:1 ,worker ", 3, ["chief:0", "ps:0", "worker:0"]),  # spaces are fine
]


@pytest.mark.parametrize(("jobs", "ntasks", "expected"), HAND_OUT)
def test_roles_follow_the_order_of_the_entries(jobs: str, ntasks: int, expected: list[str]) -> None:
    assert roles_of(jobs, ntasks) == expected


def test_mapping_and_text_give_the_same_cluster() -> None:
    env = step_vars("n[1-5]", "1(x5)", 3, SLURMD_NODENAME="n4")
    by_mapping = resolve(env, jobs={"chief": 1, "ps": 2, "worker": 2})
    by_text = resolve({**env, "SLURMTF_JOBS": "chief:1,ps:2,worker"})
    assert by_mapping.tf_config() == by_text.tf_config()
    assert by_mapping.tf_config() == {
        "cluster": {
            "chief": ["n1:15400"],
            "ps": ["n2:15401", "n3:15402"],
            "worker": ["n4:15403", "n5:15404"],
        },
        "task": {"type": "worker", "index": 0},
    }
    assert resolve(env, jobs={"chief": 1, "ps": 2, "worker": None}).roles == by_text.roles


def test_every_rank_computes_the_same_cluster_and_its_own_task() -> None:
    """Ports and addresses are per rank whatever the role: no two tasks share one."""
    layouts = [
        resolve(step_vars("n[1-3]", "2(x3)", rank, SLURMTF_JOBS="chief:1,ps:2,worker"))
        for rank in range(6)
    ]
    assert len({json.dumps(layout.cluster()) for layout in layouts}) == 1
    tasks = [(layout.task_type, layout.task_id) for layout in layouts]
    assert tasks == [
        ("chief", 0),
        ("ps", 0),
        ("ps", 1),
        ("worker", 0),
        ("worker", 1),
        ("worker", 2),
    ]
    addresses = [a for tasks_of_role in layouts[0].cluster().values() for a in tasks_of_role]
    assert len(set(addresses)) == 6
    assert [layout.is_chief for layout in layouts] == [True] + [False] * 5
    for layout in layouts:
        tf_config = json.loads(layout.tf_config_json())
        assert tf_config["task"] == {"type": layout.task_type, "index": layout.task_id}
        assert (
            tf_config["cluster"][layout.task_type][layout.task_id]
            == layout.workers[layout.task_index]
        )


def test_without_a_chief_worker_0_is_the_chief() -> None:
    ranks = [
        resolve(step_vars("n[1-3]", "1(x3)", r, SLURMTF_JOBS="worker:2,evaluator"))
        for r in range(3)
    ]
    assert [layout.is_chief for layout in ranks] == [True, False, False]
    assert ranks[2].task_type == "evaluator"


def test_without_jobs_nothing_changes() -> None:
    layout = resolve(step_vars("n[1-2]", "2(x2)", 3))
    assert layout.roles is None
    assert layout.components is None
    assert (layout.task_type, layout.task_id, layout.is_chief) == ("worker", 3, False)
    assert layout.tf_config() == {
        "cluster": {"worker": ["n1:15400", "n1:15401", "n2:15402", "n2:15403"]},
        "task": {"type": "worker", "index": 3},
    }


def test_one_task_step_and_outside_slurm_take_a_role() -> None:
    layout = resolve({"SLURMTF_JOBS": "chief:1"})
    assert layout.is_single_worker
    assert layout.task_type == "chief"
    assert layout.is_chief
    assert layout.tf_config()["cluster"] == {"chief": [layout.workers[0]]}


def test_explain_and_export_show_the_roles() -> None:
    env = step_vars("n[1-2]", "2(x2)", 1, SLURMTF_JOBS="chief:1,ps:1,worker")
    layout = resolve(env)
    text = explain(layout)
    assert "1 chief, 1 ps, 2 workers on 2 nodes" in text
    assert "this task: rank 1, ps 0" in text
    rows = [line.split() for line in text.splitlines()[2:6]]
    assert [row[-6] for row in rows] == ["chief:0", "ps:0", "worker:0", "worker:1"]
    exports = export_lines(layout)
    assert "export SLURMTF_TASK_TYPE=ps" in exports
    assert "export SLURMTF_TASK_ID=0" in exports
    assert "export SLURMTF_IS_CHIEF=0" in exports


BAD_JOBS = [
    # (SLURMTF_JOBS, tasks in the step, words the message must contain)
    ("chief:1,ps:2,worker:2", 4, "asks for 5 task(s) but the step has 4"),
    ("chief:1,ps:2,worker", 3, "asks for at least 4 task(s) but the step has 3"),
    ("chief:1,ps:1,worker:1", 4, "asks for 3 task(s) but the step has 4"),
    ("chief:1,boss:2", 4, "names the unknown role 'boss'"),
    ("chief:1,ps:0,worker", 4, "gives 'ps' a count of 0"),
    ("chief:one", 4, "has the entry 'chief:one'"),
    ("chief:1,,worker", 4, "has an empty entry"),
    ("", 4, "has an empty entry"),
    ("worker,ps:1", 4, "has an entry after the one without a count"),
    ("worker:2,worker:2", 4, "names 'worker' twice"),
    ("chief:2,worker", 4, "gives 'chief' 2 tasks"),
    ("ps:2,worker", 4, "has ps tasks but no chief"),
    ("ps@0,worker", 4, "names components in some entries only"),
    ("worker@0", 4, "this step is not part of a heterogeneous job"),
    ("chief:-1,worker", 4, "has the entry 'chief:-1'"),
]


@pytest.mark.parametrize(("jobs", "ntasks", "problem"), BAD_JOBS)
def test_bad_jobs_are_one_line_naming_the_variable(jobs: str, ntasks: int, problem: str) -> None:
    env = step_vars(f"n[1-{ntasks}]", f"1(x{ntasks})", 0, SLURMTF_JOBS=jobs)
    with pytest.raises(InputError) as info:
        resolve(env)
    message = str(info.value)
    assert message.startswith(f"SLURMTF_JOBS={jobs!r}: "), message
    assert problem in message
    assert "HINT: " in message
    assert "\n" not in message


def test_bad_mapping_names_the_argument() -> None:
    env = step_vars("n[1-2]", "1(x2)", 0)
    with pytest.raises(InputError, match=r"^jobs='chief:1,worker:3': asks for 4 task"):
        resolve(env, jobs={"chief": 1, "worker": 3})
    with pytest.raises(InputError, match="gives 'worker' the count '2'"):
        resolve(env, jobs={"worker": "2"})  # type: ignore[dict-item]


def test_parse_keeps_order_counts_and_components() -> None:
    spec = parse_jobs("chief:1@0,ps@0,worker@1")
    assert spec.entries == (
        JobEntry("chief", 1, 0),
        JobEntry("ps", None, 0),
        JobEntry("worker", None, 1),
    )
    assert spec.by_component


def test_cli_flag_overrides_the_variable(
    fake_slurm_env: FakeSlurmEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    from slurmtf.cli.resolve import main

    fake_slurm_env.step("n[1-3]", "1(x3)", 1, SLURMTF_JOBS="worker")
    assert main(["--jobs", "chief:1,ps:1,worker"]) == 0
    assert json.loads(capsys.readouterr().out)["task"] == {"type": "ps", "index": 0}
    assert main(["--jobs=chief:1,ps:1,worker:5"]) == 2
    err = capsys.readouterr().err
    assert "--jobs='chief:1,ps:1,worker:5': asks for 7 task(s)" in err
    assert "HINT:" in err


GPU_ROLES = [
    # (SLURMTF_JOBS, rank, CUDA_VISIBLE_DEVICES after the plan)
    ("chief:1,ps:1,worker", 0, ""),  # the coordinator of a ps job: none
    ("chief:1,ps:1,worker", 1, ""),  # a ps: none
    ("chief:1,ps:1,worker", 2, "0"),  # a worker keeps its share by local id
    ("chief:1,ps:1,worker", 3, "1"),
    ("chief:1,worker", 0, "0"),  # a chief of a MultiWorkerMirrored job computes
    ("worker:3,evaluator", 3, "1"),
]


@pytest.mark.parametrize(("jobs", "rank", "visible"), GPU_ROLES)
def test_gpus_per_role(jobs: str, rank: int, visible: str) -> None:
    """-N2 --ntasks-per-node=2 --gres=gpu:2: every task sees the node's two GPUs."""
    env = step_vars(
        "n[1-2]",
        "2(x2)",
        rank,
        SLURMTF_JOBS=jobs,
        CUDA_VISIBLE_DEVICES="0,1",
        SLURM_STEP_GPUS="0,1",
    )
    layout = resolve(env)
    plan = plan_gpus(layout)
    assert plan.value == visible
    if not visible:
        assert plan.change
        assert "uses no GPU" in plan.message
    kept = resolve({**env, "SLURMTF_GPU_SPLIT": "off"})
    assert plan_gpus(kept).value == "0,1"  # asked: kept as Slurm set it


def test_explain_shows_no_gpu_for_the_ps_beside_a_worker() -> None:
    env = step_vars(
        "n[1-2]", "2(x2)", 3, SLURMTF_JOBS="chief:1,ps:2,worker",
        CUDA_VISIBLE_DEVICES="0,1", SLURM_STEP_GPUS="0,1",
    )  # fmt: skip
    layout = resolve(env)
    assert layout.task_type == "worker"
    assert node_shares(layout) == ((), ("1",))  # ps 1 (local 0) none, the worker GPU 1


def test_layout_checks_roles_length() -> None:
    with pytest.raises(InputError, match="roles"):
        ClusterLayout(workers=("a:1", "b:2"), nodes=("a", "b"), roles=("chief",))
