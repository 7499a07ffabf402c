"""The job scripts as a package ships them: ``slurmtf job-scripts``, and how the scripts
hand a job to the supervisor, find the bundled models and name a missing install step.

No Slurm, no TensorFlow import: the model lookup runs the supervisor's real
``find_model`` with this interpreter, or with one that sees no site-packages.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmtf import cli
from slurmtf.cli import job_scripts
from slurmtf.runtime.job import commands
from slurmtf.runtime.job.settings import JobSettings, JobStop
from slurmtf.runtime.recovery.after_step import Step, decide_and_record
from slurmtf.runtime.recovery.evidence import LogFiles
from slurmtf.spec import bundled as jobscripts
from tests.prereqs import require

REPO = Path(__file__).resolve().parents[1]
NAMES = ["mnist.sbatch", "parameter_server.sbatch", "resnet.sbatch", "train.sbatch"]


def test_the_package_links_to_the_checkouts_scripts_one_copy_each() -> None:
    linked = sorted(p.name for p in (REPO / "slurmtf" / jobscripts.PACKAGE_DIR).iterdir())
    assert linked == sorted(p.name for p in (REPO / "jobs").glob("*.sbatch")) == NAMES
    for name in linked:
        link = REPO / "slurmtf" / jobscripts.PACKAGE_DIR / name
        assert link.is_symlink(), f"{link} must link to jobs/{name}, not copy it"
        assert link.resolve() == (REPO / "jobs" / name).resolve()
    assert [s.name for s in jobscripts.bundled()] == NAMES


def handing_over(script: jobscripts.JobScript) -> str:
    """A script's last lines, from its ``set -u``: how it hands the job to the supervisor,
    with its own kind written ``KIND``."""
    kind = script.name.removesuffix(".sbatch")
    block = script.text[script.text.rindex("\nset -u\n") + 1 :]
    return block.replace(f" job {kind} ", " job KIND ")


def test_every_script_hands_over_with_the_same_block() -> None:
    scripts = jobscripts.bundled()
    blocks = {script.name: handing_over(script) for script in scripts}
    assert blocks["mnist.sbatch"].endswith('\nexec $PY -m slurmtf job KIND -- "$@"\n')
    assert set(blocks.values()) == {blocks["mnist.sbatch"]}, blocks
    for script in scripts:
        code = [x for x in script.text.splitlines() if x.strip() and not x.lstrip().startswith("#")]
        assert len(code) <= 15, f"{script.name}: {len(code)} lines of code"
        assert '"event"' not in script.text, script.name


def hand_over(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the scripts' hand-over block in bash from an empty folder, the supervisor replaced by a
    line that prints the slurmtf the interpreter imports."""
    mnist = next(script for script in jobscripts.bundled() if script.name == "mnist.sbatch")
    block = handing_over(mnist).replace(
        'exec $PY -m slurmtf job KIND -- "$@"',
        "$PY -c 'import slurmtf; print(\"loaded\", slurmtf.__file__)'",
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PYTHON"))}
    return subprocess.run(["bash", "-c", block], capture_output=True, text=True, check=False,
                          cwd=tmp_path, env={**clean, **env})  # fmt: skip


def test_the_block_runs_a_checkouts_slurmtf_else_the_installed_one(tmp_path: Path) -> None:
    checkout = hand_over(tmp_path, SLURMTF_REPO=str(REPO), PYTHON=sys.executable)
    assert checkout.stdout.strip() == f"loaded {REPO}/slurmtf/__init__.py", checkout.stderr
    named = hand_over(tmp_path, SLURMTF_PYTHON=sys.executable, PYTHON="/nonexistent/python",
                      SLURMTF_REPO=str(REPO))  # fmt: skip
    assert named.stdout.strip() == f"loaded {REPO}/slurmtf/__init__.py", named.stderr


def test_the_block_names_the_pip_line_when_python_has_no_slurmtf(tmp_path: Path) -> None:
    bare = tmp_path / "python"  # no site-packages, no PYTHONPATH: nothing installed
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    bare.chmod(0o755)
    done = hand_over(tmp_path, PYTHON=str(bare))
    assert done.returncode == 2
    assert "loaded" not in done.stdout
    assert f"{bare} cannot import slurmtf. HINT: {bare} -m pip install" in done.stderr
    assert "SLURMTF_REPO=<a checkout of slurmtf>" in done.stderr


def test_list_says_what_each_script_is_for(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["job-scripts", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == NAMES
    assert "MNIST CNN" in lines[0]
    assert "ParameterServerStrategy: a chief (the coordinator), ps tasks" in lines[1]
    assert "ImageNet ResNet-50), data-parallel across every task" in lines[2]  # 2 header lines
    assert "Your own training script" in lines[3]


def test_writes_the_scripts_and_leaves_identical_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "new" / "dir"
    assert job_scripts.main([str(target)]) == 0
    for name in NAMES:
        assert (target / name).read_text() == (REPO / "jobs" / name).read_text()
        assert os.access(target / name, os.X_OK)
    assert job_scripts.main([str(target)]) == 0
    out = capsys.readouterr().out
    assert out.count("new ") == len(NAMES)
    assert out.count("same ") == len(NAMES)


def test_a_changed_script_is_kept_unless_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "train.sbatch"
    mine.write_text("#!/bin/bash\n# my own changes\n")
    assert job_scripts.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slurmtf job-scripts: DIR=")
    assert "train.sbatch there differs" in err
    assert "HINT:" in err
    assert "--force" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.sbatch"]  # nothing written
    assert mine.read_text() == "#!/bin/bash\n# my own changes\n"

    assert job_scripts.main([str(tmp_path), "--force"]) == 0
    assert mine.read_text() == (REPO / "jobs" / "train.sbatch").read_text()
    assert "replaced  " in capsys.readouterr().out


@pytest.mark.parametrize("argv", [[], ["--force"]])
def test_dir_or_list_is_required(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["job-scripts", *argv]) == 2
    assert "HINT:" in capsys.readouterr().err


def test_a_file_in_place_of_dir_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "f").write_text("x")
    assert job_scripts.main([str(tmp_path / "f")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def find_model(repo: Path, python: str) -> str:
    job = JobSettings.read("mnist", {"SLURMTF_REPO": str(repo), "PYTHON": python})
    return commands.find_model(job, {**os.environ, "PYTHONPATH": str(REPO)})


def test_a_checkout_runs_its_models_and_elsewhere_the_installed_ones(tmp_path: Path) -> None:
    require(importlib.util.find_spec("tensorflow") is not None, "TensorFlow (pip install .[cpu])")
    here = find_model(REPO, sys.executable)
    assert here == f"models.mnist from {REPO / 'models' / 'mnist.py'}", here
    (tmp_path / "models").mkdir()  # a user's own models/ is no checkout
    (tmp_path / "models" / "mnist.py").write_text("")
    elsewhere = find_model(tmp_path, sys.executable)
    assert elsewhere.startswith("slurmtf_models.mnist from "), elsewhere
    assert elsewhere.endswith("mnist.py")  # where it was found


def test_an_interpreter_without_slurmtf_gets_the_pip_line(tmp_path: Path) -> None:
    bare = tmp_path / "python"  # no site-packages, no PYTHONPATH: nothing installed
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    bare.chmod(0o755)
    with pytest.raises(JobStop) as caught:
        find_model(tmp_path, str(bare))
    said = str(caught.value)
    assert caught.value.status == 2
    assert f"{bare} cannot import slurmtf_models.mnist. HINT: {bare} -m pip install" in said
    assert '"slurmtf[gpu]"' in said


@pytest.mark.parametrize(
    ("error", "hint"),
    [
        ("ModuleNotFoundError: No module named 'tensorflow'",
         'has no tensorflow: python3 -m pip install "slurmtf[gpu]"'),
        ("ModuleNotFoundError: No module named 'slurmtf'",
         'has no slurmtf: python3 -m pip install "slurmtf[gpu]"'),
        ("py: Error while finding module specification for 'slurmtf_models.mnist' "
         "(ModuleNotFoundError: No module named 'slurmtf_models')", "has no slurmtf_models"),
        ("py: Error while finding module specification for 'models.mnist' "
         "(ModuleNotFoundError: No module named 'models')", "slurmtf job-scripts DIR"),
        ("ModuleNotFoundError: No module named 'mypkg'", ""),
        ("ValueError: bad shape", ""),
    ],
)  # fmt: skip
def test_a_rank_that_cannot_import_is_told_the_install_step(
    tmp_path: Path, error: str, hint: str
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "srun.err").write_text("srun: error: node1: task 0: Exited with exit code 1\n")
    (logs / "rank0.err").write_text(f"Traceback (most recent call last):\n{error}\n")
    files = LogFiles(logs, srun_err=logs / "srun.err")
    decision, _ = decide_and_record(Step("7", 1, 3, python="python3"), files)
    why = decision.why
    assert why.startswith("failed: rank 0 failed with its own error (exit code 1): "), why
    assert error.split(": ", 1)[-1] in why
    if hint:
        assert ". HINT: " in why
        assert hint in why
    else:
        assert "HINT" not in why


def test_no_shell_file_reads_event_text_and_job_sh_stays_thin() -> None:
    """The supervisor reads the ranks' events (slurmtf.events); no shell of the package
    does, and slurmtf/job.sh is a compatibility layer of at most 80 lines."""
    shells = [*(REPO / "slurmtf").rglob("*.sh"), *(REPO / "jobs").glob("*.sbatch")]
    assert REPO / "slurmtf" / "job.sh" in shells
    for path in shells:
        assert '"event"' not in path.read_text(), path
    assert len((REPO / "slurmtf" / "job.sh").read_text().splitlines()) <= 80
