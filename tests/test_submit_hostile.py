"""Hostile names, paths and setup lines cannot break or inject into the sbatch script."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from slurmtf.errors import InputError
from slurmtf.spec import jobspec
from slurmtf.spec.jobspec import JobSpec

REPO = Path(__file__).resolve().parents[1]
HOSTILE = [
    "it's",
    'say "hi"',
    "a b  c",
    "x; touch PWNED",
    "$(touch PWNED)",
    "`touch PWNED`",
    "$HOME ${PATH}",
    "a' ; touch PWNED ; echo '",
    "&& touch PWNED &",
    "| tee PWNED",
    "#SBATCH --nodes=99",
]


def run_script(script: str, tmp_path: Path) -> list[str]:
    """Run the script with a fake srun that records its arguments; return them."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    record = tmp_path / "srun_args"
    srun = bindir / "srun"
    srun.write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" > {shlex.quote(str(record))}\n')
    srun.chmod(0o755)
    path = tmp_path / "job.sh"
    path.write_text(script)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    subprocess.run(["bash", str(path)], cwd=tmp_path, env=env, check=True, timeout=30)
    return record.read_text().split("\0")[:-1]


def sbatch_options(script: str) -> dict[str, list[str]]:
    """#SBATCH lines parsed the way sbatch does (shell-like words) -> {option: [words]}."""
    out: dict[str, list[str]] = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH"):
            words = shlex.split(line[len("#SBATCH") :])
            assert len(words) == 1, line
            key, _, value = words[0].partition("=")
            out.setdefault(key, []).append(value)
    return out


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_stay_values(value: str, tmp_path: Path) -> None:
    log_dir = tmp_path / f"logs {value}".replace("/", "_")
    spec = JobSpec(
        kind="model",
        target="mnist",
        job_name=value,
        partition=value,
        account=value,
        qos=value,
        constraint=value,
        log_dir=str(log_dir),
        sbatch_extra=(("comment", value),),
    )
    script = jobspec.render_sbatch(spec, "python3")
    options = sbatch_options(script)
    for key in ("--job-name", "--partition", "--account", "--qos", "--constraint", "--comment"):
        assert options[key] == [value]
    assert options["--output"] == [f"{log_dir}/%j_0_log.out"]
    assert options["--nodes"] == ["1"]
    args = run_script(script, tmp_path)
    assert args[-1] == str(log_dir)
    assert args[-5:-1] == ["python3", "-u", "-m", "submitit.core._submit"]
    assert not list(tmp_path.rglob("PWNED"))


def test_setup_lines_run_as_written_and_nothing_else(tmp_path: Path) -> None:
    setup = (
        "echo \"a; b $((1+1))\" 'lit $HOME' > setup_out",
        "export GREETING='x; touch PWNED'",
    )
    spec = JobSpec(kind="model", target="mnist", setup=setup, log_dir=str(tmp_path / "l"))
    run_script(jobspec.render_sbatch(spec, "python3"), tmp_path)
    assert (tmp_path / "setup_out").read_text() == "a; b 2 lit $HOME\n"
    assert not list(tmp_path.rglob("PWNED"))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("job_name", "a\nb"),
        ("job_name", "a\rb"),
        ("partition", "gpu\n#SBATCH --nodes=99"),
        ("log_dir", "/tmp/x\ntouch PWNED"),
        ("log_dir", "/tmp/%j"),
        ("log_dir", "/tmp/back\\slash"),
        ("job_name", "ends with \\"),
        ("sbatch_extra", (("comment", "a\\'b"),)),
        ("account", "a\x00b"),
        ("job_name", ""),
        ("setup", ("module load x\ntouch PWNED",)),
        ("setup", ("echo 'unbalanced",)),
        ("setup", ("echo continued \\",)),
        ("setup", ("#SBATCH --nodes=99",)),
        ("setup", ("  #sbatch --nodes=99",)),
        ("sbatch_extra", (("comment", "a\nb"),)),
        ("sbatch_extra", (("nodes", "4"),)),
        ("args", ("--flag=a\nb",)),
    ],
)
def test_breaking_values_are_refused(field: str, value: object) -> None:
    with pytest.raises(InputError, match="HINT"):
        JobSpec(kind="model", target="mnist", **{field: value})  # type: ignore[arg-type]


def test_command_runs_without_a_shell() -> None:
    spec = JobSpec(kind="command", target="echo 'a; b' $HOME", args=("x;y",))
    assert jobspec.task_command(spec, {"n": "$(v)"}) == ["echo", "a; b", "$HOME", "x;y", "--n=$(v)"]
