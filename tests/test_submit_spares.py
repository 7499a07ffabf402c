"""`slurmtf submit --spare_nodes` and `--kill_on_node_failure`: the sbatch and srun options."""

from __future__ import annotations

import argparse

import pytest

from slurmtf.cli import submit as submit_cli
from slurmtf.errors import InputError
from slurmtf.spec.jobspec import JobSpec, sbatch_parameters
from slurmtf.submit import spec_from_args


def spec(*flags: str) -> JobSpec:
    options: argparse.Namespace = submit_cli._parser().parse_args(["--model=mnist", *flags])
    return spec_from_args(options, [])


def test_no_kill_by_default_and_a_flag_turns_it_off() -> None:
    assert sbatch_parameters(spec("--nodes=2"))["additional_parameters"]["no-kill"] is True
    off = sbatch_parameters(spec("--nodes=2", "--kill_on_node_failure"))
    assert "no-kill" not in off["additional_parameters"]
    # no restart budget: no supervisor runs the job, so a lost node ends it (nothing held)
    unsupervised = sbatch_parameters(spec("--nodes=2", "--max_restarts=0"))
    assert "no-kill" not in unsupervised["additional_parameters"]


def test_spares_are_allocated_and_the_step_trains_on_the_rest() -> None:
    params = sbatch_parameters(spec("--nodes=2", "--gpus_per_node=2", "--spare_nodes=1"))
    assert params["nodes"] == 2  # submitit counts the training tasks with it
    assert params["additional_parameters"]["nodes"] == 3
    assert params["srun_args"][-2:] == ["--nodes=2", "--ntasks=4"]


@pytest.mark.parametrize("flags", [("--spare_nodes=-1",), ("--nodes=2-3", "--spare_nodes=1")])
def test_bad_spares_name_the_flag(flags: tuple[str, ...]) -> None:
    with pytest.raises(InputError, match="HINT: ") as info:
        spec(*flags)
    assert info.value.name == "--spare_nodes"


def test_the_job_script_learns_the_spares_and_a_range_s_minimum() -> None:
    spares = sbatch_parameters(spec("--nodes=2", "--spare_nodes=1"))["setup"]
    ranged = sbatch_parameters(spec("--nodes=2-3"))["setup"]
    assert " --spare_nodes=1 " in spares[-1], spares
    assert " --min_nodes=2 " in ranged[-1], ranged
    assert not any("min_nodes" in line for line in spares)
