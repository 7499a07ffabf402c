"""A container prefix (``CONTAINER`` / ``submit --container_prefix``): every rank's command
starts behind it on every launch path, and slurmtf's own steps (staging, the check, node
probes) run without it. A stand-in records what an ``apptainer exec`` would have run.
No Slurm, no TensorFlow."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slurmtf.runtime.job.commands import rank_command
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.runtime.job.staging import Staging
from slurmtf.runtime.job.supervisor import Supervisor
from slurmtf.runtime.slurm_calls import probe_args
from slurmtf.spec.jobspec import JobSpec, render_sbatch
from tests.helpers.container import IMAGE_PYTHON, records, write_standin

PREFIX = "apptainer exec --nv tf.sif"


@pytest.mark.parametrize(
    ("kind", "args", "after"),
    [
        ("mnist", ["--train_steps=5"], ["python3", "-m", "slurmtf_models.mnist"]),
        ("train", ["t.py"], ["python3", "-u", "-m", "slurmtf.run", "t.py"]),
        ("parameter_server", ["t.py"], ["python3", "-u", "-m", "slurmtf.serve"]),
        ("command", ["python3", "t.py"], ["python3", "t.py"]),
        (
            "submitit",
            ["--unbuffered", "--output", "/l/%j_%t_log.out", "/p y/python", "-u", "-m",
             "submitit.core._submit", "/l"],
            ["python3", "-u", "-m", "submitit.core._submit", "/l"],  # not the login's path
        ),
    ],
)  # fmt: skip
def test_every_kind_of_job_starts_its_ranks_behind_the_prefix(
    kind: str, args: list[str], after: list[str]
) -> None:
    job = JobSettings.read(kind, {"CONTAINER": PREFIX, "SLURMTF_REPO": "/nowhere"})
    command = rank_command(job, args)
    assert list(command.args[:4]) == PREFIX.split(), command
    assert list(command.args[4 : 4 + len(after)]) == after, command
    if kind == "submitit":
        assert command.srun_args == ("--unbuffered", "--output", "/l/%j_%t_log.out")


@pytest.mark.parametrize(
    ("kind", "args"),
    [("mnist", []), ("train", ["t.py"]), ("parameter_server", ["t.py"]),
     ("submitit", ["/login/python3", "-u", "-m", "submitit.core._submit", "/l"])],
)  # fmt: skip
def test_container_python_names_the_images_interpreter(kind: str, args: list[str]) -> None:
    environ = {"CONTAINER": PREFIX, "CONTAINER_PYTHON": "/opt/conda/bin/python -X dev",
               "PYTHON": "/login/python3", "SLURMTF_REPO": "/nowhere"}  # fmt: skip
    command = rank_command(JobSettings.read(kind, environ), args)
    assert command.args[4:7] == ("/opt/conda/bin/python", "-X", "dev"), command
    assert "/login/python3" not in command.args, command
    if kind == "parameter_server":  # the chief's script, behind the servers' wrapper
        chief = command.args[command.args.index("chief") + 1 :]
        assert chief[:3] == ("/opt/conda/bin/python", "-X", "dev"), command


def test_without_a_container_the_ranks_run_python() -> None:
    environ = {"PYTHON": "/login/python3", "CONTAINER_PYTHON": "python3.12"}
    assert rank_command(JobSettings.read("train", environ), ["t.py"]).args[0] == "/login/python3"


def test_container_python_without_a_prefix_is_refused() -> None:
    from slurmtf.errors import InputError

    with pytest.raises(InputError, match=r"--container_python='python3\.12': names the interp"):
        JobSpec(kind="model", target="mnist", container_python="python3.12")


def test_python_may_hold_several_words() -> None:
    job = JobSettings.read("train", {"PYTHON": f"{PREFIX} python3 -X dev"})
    assert rank_command(job, ["t.py"]).args[:7] == (*PREFIX.split(), "python3", "-X", "dev")


def test_slurmtfs_own_steps_run_without_the_prefix(tmp_path: Path) -> None:
    job = JobSettings.read("mnist", {"CONTAINER": PREFIX, "LOG_DIR": str(tmp_path)})
    staging = Staging(job, {}, lambda *a, **k: "")
    assert staging.own("data", "stage", "/d") == [sys.executable, "-m", "slurmtf.cli", "data",
                                                  "stage", "/d"]  # fmt: skip
    assert "apptainer" not in probe_args("node1")


def test_submit_hands_the_prefix_to_the_supervisor() -> None:
    spec = JobSpec(kind="model", target="mnist", max_requeues=0, container_prefix=PREFIX,
                   container_python="python3.12")  # fmt: skip
    (line,) = [x for x in render_sbatch(spec, "python3").splitlines() if x.startswith("srun()")]
    assert f"'--container={PREFIX}'" in line, line
    assert "--container_python=python3.12" in line, line


def test_a_bad_prefix_names_the_variable(tmp_path: Path) -> None:
    from slurmtf.errors import InputError

    with pytest.raises(InputError, match="CONTAINER='apptainer \"exec': is not a command line"):
        JobSettings.read("mnist", {"CONTAINER": 'apptainer "exec'})


def test_the_supervisor_starts_each_step_through_the_prefix(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A fake srun runs the command once (as rank 0); the stand-in records it."""
    bin_dir = tmp_path / "bin"
    standin = write_standin(bin_dir)
    srun = bin_dir / "srun"
    srun.write_text(
        '#!/bin/bash\nwhile [[ "$1" == -* ]]; do shift; done\nSLURM_PROCID=0 exec "$@"\n'
    )
    srun.chmod(0o755)
    record = tmp_path / "record.jsonl"
    environ = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LOG_DIR": str(tmp_path / "logs"),
               "MODEL_DIR": str(tmp_path / "m"), "CONTAINER": f"{standin} exec --nv tf.sif",
               "STANDIN_RECORD": str(record)}  # fmt: skip
    job = JobSettings.read("command", environ)
    status = Supervisor(job, ["true"], environ, lambda *a, **k: "").run(header=False)
    assert status == 0, capfd.readouterr()
    (seen,) = records(record)
    assert seen["argv"] == ["exec", "--nv", "tf.sif", "true"], seen
    assert seen["rank"] == "0"


def test_a_local_job_starts_every_rank_behind_the_prefix(tmp_path: Path) -> None:
    """``submit --cluster=local --container_prefix=...``: each rank's launcher too."""
    import io

    from slurmtf.cli import submit as submit_cli

    standin = write_standin(tmp_path / "bin")
    record = tmp_path / "record.jsonl"
    argv = ["--cluster=local", "--nodes=2", f"--log_dir={tmp_path / 'logs'}", "--command=true",
            f"--container_prefix={standin} exec --nv tf.sif"]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STANDIN_RECORD", str(record))
        assert submit_cli.main(argv, out=io.StringIO()) == 0
    starts = records(record)
    assert len(starts) == 2, starts
    for start in starts:
        argv_seen = start["argv"]
        assert isinstance(argv_seen, list)
        assert argv_seen[:4] == ["exec", "--nv", "tf.sif", "python3"], argv_seen
        assert start["interpreter"] == IMAGE_PYTHON, start  # not the submitting one's path
