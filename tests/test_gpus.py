"""GPU visibility from Slurm's variables only: one share per task, never a shared GPU.

The variable sets in FORMS are what the sandbox's srun really sets for each task of a
2-node x 4-task step on 4-GPU nodes (see tests/e2e/test_gpu_binding.py for the same
forms end to end).
"""

from __future__ import annotations

import os

import pytest

from slurmtf.cluster.gpu_ids import (
    node_gpus,
    parse_gpu_ids,
    parse_split_mode,
    parse_visible_devices,
)
from slurmtf.cluster.gpu_plan import apply_gpu_split, node_shares, plan_gpus, split_gpus
from slurmtf.errors import InputError
from slurmtf.resolver import resolve
from tests.conftest import FakeSlurmEnv


@pytest.mark.parametrize(
    ("text", "ids"),
    [(None, None), ("", ()), ("0,1", ("0", "1")), (" 2 , 3 ", ("2", "3")), ("NoDevFiles", ())],
)
def test_parse_gpu_ids(text: str | None, ids: tuple[str, ...] | None) -> None:
    assert parse_gpu_ids(text, "SLURM_STEP_GPUS") == ids


@pytest.mark.parametrize(
    ("text", "visible"),
    [
        (None, None),
        ("", ()),
        ("-1", ()),
        ("0,1", ("0", "1")),
        ("1,-1,0", ("1",)),  # CUDA stops at the first invalid entry
        ("GPU-8a1b,MIG-2c", ("GPU-8a1b", "MIG-2c")),
    ],
)
def test_parse_visible_devices(text: str | None, visible: tuple[str, ...] | None) -> None:
    assert parse_visible_devices(text) == visible


NODE_GPUS = [
    # (SLURM_STEP_GPUS, SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS, node's GPUs)
    ("4,5", "2", None, ("4", "5")),
    (None, "3", None, ("0", "1", "2")),
    (None, None, None, None),
    ("0,1", None, None, ("0", "1")),
    ("2", "4", None, ("0", "1", "2", "3")),  # per-task binding narrows SLURM_STEP_GPUS
    ("6", "4", "4,5,6,7", ("4", "5", "6", "7")),  # ... the job's list says which four
    ("6", "4", "4,5", ("0", "1", "2", "3")),  # a job list of another size is not the step's
]


@pytest.mark.parametrize(("step", "count", "job", "expected"), NODE_GPUS)
def test_node_gpus(
    step: str | None, count: str | None, job: str | None, expected: tuple[str, ...] | None
) -> None:
    assert node_gpus(step, "SLURM_STEP_GPUS", count, job) == expected


@pytest.mark.parametrize(
    ("count", "match"), [("x", "SLURM_GPUS_ON_NODE='x'"), ("99999999999", "more than 1024")]
)
def test_node_gpus_rejects_a_bad_count(count: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        node_gpus(None, "SLURM_STEP_GPUS", count)


def test_split_mode() -> None:
    modes = [parse_split_mode(t) for t in (None, "", "OFF", " force ")]
    assert modes == ["auto", "auto", "off", "force"]
    with pytest.raises(InputError, match=r"SLURMTF_GPU_SPLIT='on'.*HINT: use one of auto, off"):
        parse_split_mode("on")


SPLITS = [
    # (visible, local id, local tasks, share)
    (("0", "1"), 0, 2, ("0",)),
    (("0", "1"), 1, 2, ("1",)),
    (("0", "1", "2", "3"), 1, 2, ("2", "3")),
    (("0", "1", "2"), 1, 2, ("1",)),  # the remainder stays unused
    ((), 0, 2, ()),
    (("4", "6"), 1, 2, ("6",)),  # Slurm's ids, not positions
    (("0", "1", "2", "3"), 3, 4, ("3",)),
]


@pytest.mark.parametrize(("visible", "local_id", "tasks", "share"), SPLITS)
def test_split_gpus(
    visible: tuple[str, ...], local_id: int, tasks: int, share: tuple[str, ...]
) -> None:
    assert split_gpus(visible, local_id, tasks) == share


def test_split_never_shares_a_gpu() -> None:
    with pytest.raises(InputError, match=r"CUDA_VISIBLE_DEVICES='0,1': holds 2 GPU\(s\) for the 4"):
        split_gpus(("0", "1"), 3, 4)
    with pytest.raises(InputError, match="SLURM_LOCALID"):
        split_gpus(("0",), 2, 2)


def _rank_vars(form: str, rank: int, tasks_per_node: int = 4) -> dict[str, str]:
    """What the sandbox's srun sets for ``rank`` of ``-N2`` with 4 GPUs per node."""
    local = rank % tasks_per_node
    everything = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_STEP_GPUS": "0,1,2,3"}
    bound = {"CUDA_VISIBLE_DEVICES": str(local), "SLURM_STEP_GPUS": str(local)}
    mapped = {"CUDA_VISIBLE_DEVICES": str(3 - local), "SLURM_STEP_GPUS": str(3 - local)}
    gpus = {
        "gres": everything,
        "gpus-per-node": everything,
        "gpus-per-task": bound,
        "gpu-bind=per_task:1": bound,
        "gpu-bind=map_gpu:3,2,1,0": mapped,
        "one-task-per-node": everything,
    }[form]
    return FakeSlurmEnv.step_vars(
        "node[1-2]",
        f"{tasks_per_node}(x2)",
        rank,
        SLURM_LOCALID=local,
        SLURMD_NODENAME=f"node{rank // tasks_per_node + 1}",
        SLURM_GPUS_ON_NODE=4,
        SLURM_JOB_GPUS="0,1,2,3",
        **gpus,
    )


FORMS = [
    # (form, every rank's CUDA_VISIBLE_DEVICES after the plan, rank 0's others on the node)
    ("gres", ["0", "1", "2", "3"] * 2, ["0", "1", "2", "3"]),
    ("gpus-per-node", ["0", "1", "2", "3"] * 2, ["0", "1", "2", "3"]),
    ("gpus-per-task", ["0", "1", "2", "3"] * 2, ["0", "1", "2", "3"]),
    ("gpu-bind=per_task:1", ["0", "1", "2", "3"] * 2, ["0", "1", "2", "3"]),
    ("gpu-bind=map_gpu:3,2,1,0", ["3", "2", "1", "0"] * 2, ["3", "?", "?", "?"]),
]


@pytest.mark.parametrize(("form", "visible", "shares"), FORMS)
def test_every_form_gives_each_rank_of_a_node_its_own_gpu(
    form: str, visible: list[str], shares: list[str]
) -> None:
    plans = [plan_gpus(resolve(_rank_vars(form, rank))) for rank in range(8)]
    assert [p.value for p in plans] == visible
    assert [p.replicas for p in plans] == [1] * 8
    for node in (plans[:4], plans[4:]):  # never two workers of a node on one GPU
        assert len({p.value for p in node}) == 4
    seen = node_shares(resolve(_rank_vars(form, 0)))
    assert [",".join(s) if s is not None else "?" for s in seen] == shares


def test_explain_view_uses_cuda_numbers_when_cgroups_renumber() -> None:
    layout = resolve(
        FakeSlurmEnv.step_vars(
            "n[1-2]", "2(x2)", 1, SLURM_LOCALID=1, CUDA_VISIBLE_DEVICES="0,1",
            SLURM_STEP_GPUS="6,7",
        )
    )  # fmt: skip
    assert node_shares(layout) == (("0",), ("1",))


def test_one_task_per_node_keeps_all_four() -> None:
    for rank in (0, 1):
        layout = resolve(_rank_vars("one-task-per-node", rank, tasks_per_node=1))
        plan = plan_gpus(layout)
        assert (plan.value, plan.change, plan.replicas) == ("0,1,2,3", False, 4)
        assert node_shares(layout) == (("0", "1", "2", "3"),)


PLANS = [
    # (gpu variables, (procid, local id), (change?, visible after), message fragment)
    ({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "0,1"}, (1, 1), (True, ("1",)), "0,1 -> 1"),
    (
        {"CUDA_VISIBLE_DEVICES": "1", "SLURM_STEP_GPUS": "1", "SLURM_GPUS_ON_NODE": "2"},
        (1, 1),
        (False, ("1",)),
        "per-task",
    ),
    ({"SLURM_STEP_GPUS": "2,3"}, (0, 0), (True, ("2",)), "unset -> 2"),
    ({"SLURM_GPUS_ON_NODE": "4"}, (3, 1), (True, ("2", "3")), "unset -> 2,3"),
    (
        {"CUDA_VISIBLE_DEVICES": "0,1,2", "SLURM_GPUS_ON_NODE": "3"},
        (1, 1),
        (True, ("1",)),
        "1 GPU(s) unused",
    ),
    ({}, (0, 0), (False, None), "no GPUs"),
    ({"CUDA_VISIBLE_DEVICES": "", "SLURM_STEP_GPUS": "0,1"}, (0, 0), (False, ()), "hides"),
    (
        {"CUDA_VISIBLE_DEVICES": "0,1", "SLURMTF_GPU_SPLIT": "off"},
        (1, 1),
        (False, ("0", "1")),
        "off",
    ),
    (
        {"CUDA_VISIBLE_DEVICES": "0,1", "SLURMTF_GPU_SPLIT": "force"},
        (1, 1),
        (True, ("1",)),
        "0,1 -> 1",
    ),
    # cgroups renumber CUDA_VISIBLE_DEVICES; Slurm's ids stay global: split what CUDA reads
    ({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "6,7"}, (1, 1), (True, ("1",)), "0,1 -> 1"),
]


@pytest.mark.parametrize(("gpu_vars", "where", "expected", "message"), PLANS)
def test_plan_gpus(
    gpu_vars: dict[str, str],
    where: tuple[int, int],
    expected: tuple[bool, tuple[str, ...] | None],
    message: str,
) -> None:
    procid, localid = where
    layout = resolve(
        FakeSlurmEnv.step_vars("n[1-2]", "2(x2)", procid, SLURM_LOCALID=localid, **gpu_vars)
    )
    plan = plan_gpus(layout)
    assert (plan.change, plan.visible) == expected
    assert message in plan.message


REFUSALS = [
    # (gpu variables, tasks per node, the one-line error's start, its hint)
    (
        {"CUDA_VISIBLE_DEVICES": "0,1"},
        "2(x2)",
        "CUDA_VISIBLE_DEVICES='0,1': is seen by 2 tasks",
        "SLURMTF_GPU_SPLIT=force",
    ),
    (
        {"CUDA_VISIBLE_DEVICES": "0", "SLURM_STEP_GPUS": "0"},
        "4(x2)",
        "CUDA_VISIBLE_DEVICES='0': holds 1 GPU(s) for the 4 tasks",
        "--gpus-per-task=1",
    ),
    (
        {"CUDA_VISIBLE_DEVICES": "1", "SLURM_STEP_GPUS": "1", "SLURM_GPUS_ON_NODE": "2"},
        "4(x2)",
        "CUDA_VISIBLE_DEVICES='1': binds 1 GPU(s) to each of the 4 tasks",
        "--ntasks-per-node=N",
    ),
    (
        {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_GPUS_ON_NODE": "2"},
        "2(x2)",
        "CUDA_VISIBLE_DEVICES='0,1,2,3': lists 4 GPUs but Slurm gave this step 2",
        "SLURMTF_GPU_SPLIT=off",
    ),
]


@pytest.mark.parametrize(("gpu_vars", "tasks", "problem", "hint"), REFUSALS)
def test_plan_refuses_what_it_cannot_decide(
    gpu_vars: dict[str, str], tasks: str, problem: str, hint: str
) -> None:
    layout = resolve(FakeSlurmEnv.step_vars("n[1-2]", tasks, 1, SLURM_LOCALID=1, **gpu_vars))
    with pytest.raises(InputError) as info:
        plan_gpus(layout)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(problem), text
    assert hint in text.split("HINT:")[1], text
    assert node_shares(layout)[1] is None  # the explain view shows it as unknown


def test_apply_writes_only_the_given_mapping(fake_slurm_env: FakeSlurmEnv) -> None:
    layout = resolve(
        FakeSlurmEnv.step_vars(
            "n[1-2]", "2(x2)", 1, CUDA_VISIBLE_DEVICES="0,1", SLURM_STEP_GPUS="0,1"
        )
    )
    target = {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert apply_gpu_split(layout, target).visible == ("1",)
    assert target == {"CUDA_VISIBLE_DEVICES": "1"}
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    kept = resolve(FakeSlurmEnv.step_vars("n[1-2]", "1(x2)", 1, CUDA_VISIBLE_DEVICES="0,1"))
    assert apply_gpu_split(kept, target).value == "0,1"
    assert target == {"CUDA_VISIBLE_DEVICES": "1"}  # nothing to change: nothing written


def test_cpu_nodes_show_no_gpus() -> None:
    layout = resolve(FakeSlurmEnv.step_vars("n[1-2]", "2(x2)", 0))
    assert layout.gpus is None
    assert (plan_gpus(layout).value, plan_gpus(layout).replicas) == (None, 1)
    assert node_shares(layout) == ((), ())


def test_layout_gpus_prefer_cuda_visible_devices() -> None:
    layout = resolve(
        FakeSlurmEnv.step_vars(
            "n[1-2]", "2(x2)", 0, CUDA_VISIBLE_DEVICES="1", SLURM_STEP_GPUS="0,1"
        )
    )
    assert (layout.gpus, layout.node_gpus, layout.local_tasks) == (("1",), ("0", "1"), 2)
