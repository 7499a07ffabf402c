"""How submit asks Slurm for GPUs: one task per GPU share, each bound to its own GPUs."""

from __future__ import annotations

from typing import Any

import pytest

from slurmtf.errors import InputError
from slurmtf.spec.jobspec import JobSpec, sbatch_parameters

BINDINGS = [
    # (gpu_flag, gpus_per_task, sbatch_extra, tasks per node, GPU parameter, srun binding)
    ("gres", 1, (), 4, ("gres", "gpu:4"), "--gpu-bind=per_task:1"),
    ("gpus-per-node", 1, (), 4, ("gpus_per_node", 4), "--gpu-bind=per_task:1"),
    ("gpus-per-task", 1, (), 4, ("gpus_per_task", 1), None),  # Slurm binds by itself
    ("gres", 2, (), 2, ("gres", "gpu:4"), "--gpu-bind=per_task:2"),
    ("gres", 4, (), 1, ("gres", "gpu:4"), None),  # one worker keeps all four
    ("gpus-per-task", 4, (), 1, ("gpus_per_task", 4), None),
    ("gres", 1, (("gpu-bind", "map_gpu:3,2,1,0"),), 4, ("gres", "gpu:4"), None),  # user's own
]


@pytest.mark.parametrize("case", BINDINGS)
def test_gpu_request_and_binding(case: tuple[Any, ...]) -> None:
    flag, per_task, extra, tasks, param, bind = case
    spec = JobSpec(
        kind="model", target="mnist", nodes=2, gpus_per_node=4, gpu_flag=flag,
        gpus_per_task=per_task, sbatch_extra=extra,
    )  # fmt: skip
    params = sbatch_parameters(spec)
    assert (spec.tasks_per_node, params["ntasks_per_node"]) == (tasks, tasks)
    assert params[param[0]] == param[1]
    binds = [a for a in params["srun_args"] if a.startswith("--gpu-bind")]
    assert binds == ([bind] if bind else [])


def test_no_gpus_no_binding() -> None:
    params = sbatch_parameters(JobSpec(kind="model", target="mnist", nodes=2))
    assert params["srun_args"] == ["--kill-on-bad-exit=1"]


def test_gpus_per_task_must_divide_the_node() -> None:
    with pytest.raises(InputError, match=r"--gpus_per_task=3: does not divide --gpus_per_node=4"):
        JobSpec(kind="model", target="mnist", gpus_per_node=4, gpus_per_task=3)
    with pytest.raises(InputError, match=r"--gpus_per_task=0: must be at least 1"):
        JobSpec(kind="model", target="mnist", gpus_per_node=4, gpus_per_task=0)
