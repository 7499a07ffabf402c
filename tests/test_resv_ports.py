"""When a step asks srun for reserved ports: slurmtf.slurm.resv_ports (slurmtf check) and
slurmtf/job.sh (the job scripts, submit's jobs) spell one rule; a fake ``scontrol`` prints
the configuration. No Slurm, no TensorFlow."""

from __future__ import annotations

import re
from typing import Any

import pytest

from slurmtf.cluster.ports import parse_resv_mode
from slurmtf.errors import InputError, SlurmCommandError
from slurmtf.runtime.job.commands import rank_command
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.runtime.job.step_nodes import first_placement
from slurmtf.runtime.job.supervisor import Supervisor
from slurmtf.slurm.resv_ports import cluster_span, mpi_ports_span, resv_ports_args

WITH = "MpiDefault              = none\nMpiParams               = ports=20000-20999\n"
WITHOUT = "MpiDefault              = none\nMpiParams               = (null)\n"
SMALL = "MpiParams               = ports=12000-12003\n"


@pytest.mark.parametrize(
    ("config", "span"),
    [(WITH, 1000), (WITHOUT, 0), (SMALL, 4), ("", 0),
     ("MpiParams = disable_slurm_hydra_bootstrap,ports=30000-30009\n", 10)],
)  # fmt: skip
def test_the_span_of_mpiparams_ports(config: str, span: int) -> None:
    assert mpi_ports_span(config) == span


# (SLURMTF_RESV_PORTS, scontrol show config, ntasks, srun's option)
CASES = [
    (None, WITH, 4, ["--resv-ports=4"]),
    ("auto", WITH, 1000, ["--resv-ports=1000"]),
    (None, WITH, 1001, []),  # more than the range: Slurm would refuse the step
    (None, WITHOUT, 4, []),
    ("1", WITHOUT, 4, ["--resv-ports=4"]),  # told: ask anyway
    ("0", WITH, 4, []),
    ("off", SMALL, 2, []),
    ("on", SMALL, 8, []),  # told, but the range cannot hold 8
]


@pytest.mark.parametrize(("mode", "config", "ntasks", "expected"), CASES)
def test_python_asks_as_the_rule_says(
    mode: str | None, config: str, ntasks: int, expected: list[str]
) -> None:
    assert resv_ports_args(ntasks, mpi_ports_span(config), parse_resv_mode(mode)) == expected


def step_args(config: str, env: dict[str, str], kind: str = "command") -> list[str]:
    """The supervisor's srun arguments for the first step, ``scontrol show config``
    answering ``config``."""
    environ = {"SLURM_JOB_ID": "7", "PYTHON": "python3", "LOG_DIR": "/l", **env}
    if kind == "submitit":
        args = ["--unbuffered", "python3", "-u", "-m", "submitit.core._submit", "/l"]
    else:
        args = ["python", "-m", "x"]

    def runner(argv: Any, **_: Any) -> str:
        assert list(argv) == ["scontrol", "show", "config"]
        return config

    job = JobSettings.read(kind, environ)
    supervisor = Supervisor(job, args, environ, runner)
    supervisor.nodes, supervisor.place = first_placement(job)
    return supervisor.step_args(rank_command(job, args))


@pytest.mark.parametrize(("mode", "config", "ntasks", "expected"), CASES)
def test_the_supervisor_asks_as_the_rule_says(
    mode: str | None, config: str, ntasks: int, expected: list[str]
) -> None:
    env = {"SLURM_NTASKS": str(ntasks), "SLURM_JOB_NUM_NODES": "2"}
    if mode is not None:
        env["SLURMTF_RESV_PORTS"] = mode
    got = [a for a in step_args(config, env) if a.startswith("--resv-ports")]
    assert got == expected


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SLURM_NTASKS": "6"}, "--resv-ports=6"),  # the job's count stands
        ({"SLURM_JOB_NUM_NODES": "3", "TASKS_PER_NODE": "2"}, "--resv-ports=6"),  # the step's
        ({"SLURM_JOB_NUM_NODES": "3"}, "--resv-ports=3"),
        ({"SLURM_NTASKS": "4", "SLURM_HET_SIZE": "2"}, ""),  # a het job: no reservation
    ],
)
def test_the_supervisor_counts_the_steps_ranks(env: dict[str, str], expected: str) -> None:
    got = [a for a in step_args(WITH, env) if a.startswith("--resv-ports")]
    assert got == ([expected] if expected else [])


def test_a_bad_setting_names_the_variable() -> None:
    with pytest.raises(InputError, match=re.escape("SLURMTF_RESV_PORTS='x': is not auto, 1 or 0")):
        JobSettings.read("mnist", {"SLURMTF_RESV_PORTS": "x"})


def test_the_job_scripts_and_submits_steps_carry_the_option() -> None:
    """The job scripts' steps and submit's srun line both pass it to srun."""
    env = {"SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "2"}
    assert "--resv-ports=2" in step_args(WITH, env)
    assert "--resv-ports=2" in step_args(WITH, env, kind="submitit")


def test_cluster_span_asks_scontrol() -> None:
    def runner(args: Any, **_: Any) -> str:
        assert list(args) == ["scontrol", "show", "config"]
        return WITH

    def failing(args: Any, **_: Any) -> str:
        raise SlurmCommandError("scontrol", 1, "slurm_load_ctl_conf error")

    assert cluster_span(runner) == 1000
    assert cluster_span(failing) == 0
