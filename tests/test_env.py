"""read_slurm_env: the one reader of the environment."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from slurmtf.cluster.env import SlurmEnv, read_slurm_env
from slurmtf.errors import InputError
from tests.conftest import FakeSlurmEnv


def test_outside_slurm_everything_is_unset(fake_slurm_env: FakeSlurmEnv) -> None:
    env = read_slurm_env()
    assert env == SlurmEnv()
    assert env.scope == "none"
    assert not env.in_slurm
    assert env.sources == ()


def test_reads_os_environ_by_default(fake_slurm_env: FakeSlurmEnv) -> None:
    fake_slurm_env.step("n[1-2]", "1(x2)", 1, job_id=42, SLURMD_NODENAME="n2", SLURM_LOCALID=0)
    env = read_slurm_env()
    assert (env.scope, env.nodelist, env.tasks_per_node, env.num_tasks) == (
        "step",
        "n[1-2]",
        "1(x2)",
        "2",
    )
    assert (env.procid, env.localid, env.nodename, env.job_id) == ("1", "0", "n2", "42")
    assert env.in_slurm


VARIABLES = [
    # (variable, SlurmEnv field)
    ("SLURM_NODEID", "nodeid"),
    ("SLURM_ARRAY_JOB_ID", "array_job_id"),
    ("SLURM_ARRAY_TASK_ID", "array_task_id"),
    ("SLURM_HET_JOB_ID", "het_job_id"),
    ("SLURM_HET_JOB_OFFSET", "het_job_offset"),
    ("SLURM_RESTART_COUNT", "restart_count"),
    ("SLURM_DISTRIBUTION", "distribution"),
    ("SLURM_DIST_PLANESIZE", "plane_size"),
    ("SLURMTF_PORT_BASE", "port_base"),
    ("SLURMTF_ADDRESS_TEMPLATE", "address_template"),
    ("CUDA_VISIBLE_DEVICES", "cuda_visible_devices"),
    ("SLURM_GPUS_ON_NODE", "gpus_on_node"),
]


@pytest.mark.parametrize(("name", "field"), VARIABLES)
def test_each_variable_lands_in_its_field(name: str, field: str) -> None:
    env = read_slurm_env({name: "v-1"})
    assert getattr(env, field) == "v-1"


def test_step_variables_come_first() -> None:
    env = read_slurm_env(
        {
            "SLURM_STEP_NODELIST": "a[1-2]",
            "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
            "SLURM_JOB_NODELIST": "a[1-4]",
            "SLURM_TASKS_PER_NODE": "1(x4)",
            "SLURM_NTASKS": "4",
        }
    )
    assert (env.scope, env.nodelist, env.tasks_per_node) == ("step", "a[1-2]", "1(x2)")
    assert env.num_tasks is None  # never mixed with the job's count
    assert env.sources == ("SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")


def test_job_variables_and_old_names_are_fallbacks() -> None:
    env = read_slurm_env({"SLURM_NODELIST": "b1", "SLURM_TASKS_PER_NODE": "2", "SLURM_NPROCS": "2"})
    assert env.scope == "job"
    assert (env.nodelist, env.num_tasks) == ("b1", "2")
    assert env.sources == ("SLURM_NODELIST", "SLURM_TASKS_PER_NODE", "SLURM_NPROCS")
    assert read_slurm_env({"SLURM_JOBID": "9"}).job_id == "9"


def test_step_gpus_before_job_gpus() -> None:
    env = read_slurm_env({"SLURM_STEP_GPUS": "2,3", "SLURM_JOB_GPUS": "0,1,2,3"})
    assert (env.slurm_gpus, env.slurm_gpus_var) == ("2,3", "SLURM_STEP_GPUS")
    env = read_slurm_env({"SLURM_JOB_GPUS": "0,1"})
    assert (env.slurm_gpus, env.slurm_gpus_var) == ("0,1", "SLURM_JOB_GPUS")


def test_debug_log_names_the_variables_used(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="slurmtf.cluster.env"):
        read_slurm_env({"SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "1"})
    assert "Slurm job variables used: SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE" in caplog.text


def test_hostfile_is_read_only_for_arbitrary(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("n1\nn2\n")
    env = read_slurm_env({"SLURM_HOSTFILE": str(path), "SLURM_DISTRIBUTION": "arbitrary"})
    assert (env.hostfile, env.hostfile_text) == (str(path), "n1\nn2\n")
    env = read_slurm_env({"SLURM_HOSTFILE": str(path), "SLURM_DISTRIBUTION": "block"})
    assert env.hostfile_text is None


@pytest.mark.parametrize(
    ("content", "problem"),
    [(None, "cannot be read"), (b"\xff\xfe\x00n1\n", "is not a plain ASCII text file")],
)
def test_bad_hostfile_is_a_clear_error(tmp_path: Path, content: bytes | None, problem: str) -> None:
    path = tmp_path / "hosts"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InputError) as info:
        read_slurm_env({"SLURM_HOSTFILE": str(path), "SLURM_DISTRIBUTION": "arbitrary"})
    message = str(info.value)
    assert message.startswith(f"SLURM_HOSTFILE={str(path)!r}: {problem}")
    assert "HINT:" in message


def test_slurm_env_is_frozen() -> None:
    env = SlurmEnv()
    with pytest.raises(AttributeError):
        env.procid = "1"  # type: ignore[misc]
    with pytest.raises(InputError):
        SlurmEnv(scope="batch")
