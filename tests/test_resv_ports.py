"""When a step asks srun for reserved ports: slurmtf.slurm.resv_ports (slurmtf check) and
slurmtf/job.sh (the job scripts, submit's jobs) spell one rule; a fake ``scontrol`` prints
the configuration. No Slurm, no TensorFlow."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from slurmtf.cluster.ports import parse_resv_mode
from slurmtf.errors import SlurmCommandError
from slurmtf.slurm.resv_ports import cluster_span, mpi_ports_span, resv_ports_args

JOB_SH = Path(__file__).resolve().parents[1] / "slurmtf" / "job.sh"
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


def _job_sh(
    tmp_path: Path, config: str, script: str, **env: str
) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "config").write_text(config)
    fake = bin_dir / "scontrol"
    fake.write_text(f'#!/bin/bash\n[ "$*" = "show config" ] && cat {tmp_path / "config"}\n')
    fake.chmod(0o755)
    setup = "".join(f"export {k}={v}\n" for k, v in env.items())
    text = f"source {JOB_SH}\nPATH={bin_dir}:$PATH\n{setup}{script}"
    return subprocess.run(["bash", "-c", text], capture_output=True, text=True, check=False)


@pytest.mark.parametrize(("mode", "config", "ntasks", "expected"), CASES)
def test_job_sh_asks_as_the_rule_says(
    tmp_path: Path, mode: str | None, config: str, ntasks: int, expected: list[str]
) -> None:
    env = {} if mode is None else {"SLURMTF_RESV_PORTS": mode}
    script = (
        f"slurmtf_resv_setup\nslurmtf_resv_args --nodes=2 --ntasks={ntasks}\n"
        'echo "[${slurmtf_resv[*]}]"\n'
    )
    done = _job_sh(tmp_path, config, script, **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"[{' '.join(expected)}]"


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ("--nodes=2 --ntasks=4 --overlap --ntasks=2", {}, "--resv-ports=2"),  # the last wins
        ("--overlap", {"SLURM_NTASKS": "6"}, "--resv-ports=6"),  # submit's job
        ("", {"SLURM_JOB_NUM_NODES": "3"}, "--resv-ports=3"),
        ("--ntasks=4", {"SLURM_HET_SIZE": "2"}, ""),  # a het job: no reservation
    ],
)
def test_job_sh_counts_the_steps_ranks(
    tmp_path: Path, args: str, env: dict[str, str], expected: str
) -> None:
    script = f'slurmtf_resv_setup\nslurmtf_resv_args {args}\necho "[${{slurmtf_resv[*]}}]"\n'
    done = _job_sh(tmp_path, WITH, script, **env)
    assert done.stdout.strip() == f"[{expected}]", done.stderr


def test_job_sh_refuses_a_bad_setting(tmp_path: Path) -> None:
    done = _job_sh(tmp_path, WITH, "slurmtf_resv_setup\necho reached\n", SLURMTF_RESV_PORTS="x")
    assert done.returncode == 2
    assert "reached" not in done.stdout
    assert "SLURMTF_RESV_PORTS='x' is not auto, 1 or 0. HINT: " in done.stderr


def test_the_job_scripts_srun_carries_the_option(tmp_path: Path) -> None:
    """slurmtf_srun_ranks (jobs/*.sbatch) and submit's srun both pass it to srun."""
    (tmp_path / "bin").mkdir()
    srun = tmp_path / "bin" / "srun"
    srun.write_text('#!/bin/bash\necho "srun $*"\n')
    srun.chmod(0o755)
    script = (
        f"LOG_DIR={tmp_path}\nsrun_tasks=(--nodes=2 --ntasks-per-node=1 --ntasks=2)\n"
        "slurmtf_resv_setup\nslurmtf_srun_ranks python -m x\nslurmtf_srun_submitit python -m y\n"
    )
    done = _job_sh(tmp_path, WITH, script, SLURM_NTASKS="2")
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout + done.stderr
    assert all("--resv-ports=2" in line for line in lines), lines


def test_cluster_span_asks_scontrol() -> None:
    def runner(args: Any, **_: Any) -> str:
        assert list(args) == ["scontrol", "show", "config"]
        return WITH

    def failing(args: Any, **_: Any) -> str:
        raise SlurmCommandError("scontrol", 1, "slurm_load_ctl_conf error")

    assert cluster_span(runner) == 1000
    assert cluster_span(failing) == 0
