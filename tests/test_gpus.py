"""GPU visibility from Slurm's variables only: keep Slurm's binding, opt-in split."""

from __future__ import annotations

import logging
import os

import pytest

from slurmtf.errors import InputError
from slurmtf.gpus import (
    apply_gpu_split,
    node_gpus,
    parse_gpu_ids,
    parse_visible_devices,
    plan_gpu_split,
    split_gpus,
)
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


def test_node_gpus_from_ids_or_count() -> None:
    assert node_gpus("4,5", "SLURM_STEP_GPUS", "2") == ("4", "5")
    assert node_gpus(None, "SLURM_STEP_GPUS", "3") == ("0", "1", "2")
    assert node_gpus(None, "SLURM_STEP_GPUS", None) is None
    with pytest.raises(InputError, match="SLURM_GPUS_ON_NODE='x'"):
        node_gpus(None, "SLURM_STEP_GPUS", "x")
    with pytest.raises(InputError, match="more than 1024 GPUs"):
        node_gpus(None, "SLURM_STEP_GPUS", "99999999999")


SPLITS = [
    # (visible, local id, local tasks, share)
    (("0", "1"), 0, 2, ("0",)),
    (("0", "1"), 1, 2, ("1",)),
    (("0", "1", "2", "3"), 1, 2, ("2", "3")),
    (("0", "1", "2"), 1, 2, ("1",)),  # the remainder stays unused
    (("0", "1"), 2, 4, ("0",)),  # fewer GPUs than tasks: shared round-robin
    (("0", "1"), 3, 4, ("1",)),
    ((), 0, 2, ()),
    (("4", "6"), 1, 2, ("6",)),  # Slurm's ids, not positions
]


@pytest.mark.parametrize(("visible", "local_id", "tasks", "share"), SPLITS)
def test_split_gpus(
    visible: tuple[str, ...], local_id: int, tasks: int, share: tuple[str, ...]
) -> None:
    assert split_gpus(visible, local_id, tasks) == share


def test_split_rejects_a_bad_local_id() -> None:
    with pytest.raises(InputError, match="SLURM_LOCALID"):
        split_gpus(("0",), 2, 2)


PLANS = [
    # (gpu variables, (procid, local id), (change?, visible after), message fragment)
    ({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "0,1"}, (1, 1), (True, ("1",)), "0,1 -> 1"),
    ({"CUDA_VISIBLE_DEVICES": "1", "SLURM_STEP_GPUS": "0,1"}, (1, 1), (False, ("1",)), "per-task"),
    ({"SLURM_STEP_GPUS": "2,3"}, (0, 0), (True, ("2",)), "unset -> 2"),
    ({"SLURM_GPUS_ON_NODE": "4"}, (3, 1), (True, ("2", "3")), "unset -> 2,3"),
    ({}, (0, 0), (False, None), "no GPUs"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, (0, 0), (False, ("0", "1")), "left alone"),
]


@pytest.mark.parametrize(("gpu_vars", "where", "expected", "message"), PLANS)
def test_plan_gpu_split(
    gpu_vars: dict[str, str],
    where: tuple[int, int],
    expected: tuple[bool, tuple[str, ...] | None],
    message: str,
) -> None:
    procid, localid = where
    layout = resolve(
        FakeSlurmEnv.step_vars("n[1-2]", "2(x2)", procid, SLURM_LOCALID=localid, **gpu_vars)
    )
    plan = plan_gpu_split(layout)
    assert (plan.change, plan.visible) == expected
    assert message in plan.message


def test_one_task_per_node_keeps_everything() -> None:
    layout = resolve(FakeSlurmEnv.step_vars("n[1-2]", "1(x2)", 1, CUDA_VISIBLE_DEVICES="0,1"))
    plan = plan_gpu_split(layout)
    assert (plan.change, plan.visible) == (False, ("0", "1"))


def test_apply_writes_only_the_given_mapping(fake_slurm_env: FakeSlurmEnv) -> None:
    layout = resolve(
        FakeSlurmEnv.step_vars(
            "n[1-2]", "2(x2)", 1, CUDA_VISIBLE_DEVICES="0,1", SLURM_STEP_GPUS="0,1"
        )
    )
    target = {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert apply_gpu_split(layout, target) == ("1",)
    assert target == {"CUDA_VISIBLE_DEVICES": "1"}
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_apply_refuses_an_unknown_setting_unless_forced(caplog: pytest.LogCaptureFixture) -> None:
    layout = resolve(FakeSlurmEnv.step_vars("n[1-2]", "2(x2)", 1, CUDA_VISIBLE_DEVICES="0,1"))
    target = {"CUDA_VISIBLE_DEVICES": "0,1"}
    with caplog.at_level(logging.WARNING, logger="slurmtf.gpus"):
        assert apply_gpu_split(layout, target) == ("0", "1")
    assert target == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert "left alone" in caplog.text
    assert "force=True" in caplog.text
    assert apply_gpu_split(layout, target, force=True) == ("1",)
    assert target == {"CUDA_VISIBLE_DEVICES": "1"}


def test_layout_gpus_prefer_cuda_visible_devices() -> None:
    layout = resolve(
        FakeSlurmEnv.step_vars(
            "n[1-2]", "2(x2)", 0, CUDA_VISIBLE_DEVICES="1", SLURM_STEP_GPUS="0,1"
        )
    )
    assert (layout.gpus, layout.node_gpus, layout.local_tasks) == (("1",), ("0", "1"), 2)
    cpu = resolve(FakeSlurmEnv.step_vars("n[1-2]", "2(x2)", 0))
    assert cpu.gpus is None
