"""``python -m slurmtf.run SCRIPT``: the script runs as ``python SCRIPT`` would.

Each case runs a small script (no TensorFlow) both ways and compares what the script
saw and how the process ended: ``sys.argv``, ``__name__``, ``sys.path[0]``, exit status,
``SystemExit`` values, exceptions (the traceback without the launcher's frames), a
signal that ends the script. The launcher also exports ``TF_CONFIG`` before the first
line. No Slurm: the task is a single worker.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slurmtf.cli.run import parse_target
from slurmtf.errors import InputError, UsageError
from slurmtf.runtime.rank.script import Target
from slurmtf.spec.jobspec import JobSpec, task_command, through_launcher

SCRIPT = """\
import json, os, sys
print(json.dumps({"argv": sys.argv, "name": __name__, "path0": sys.path[0],
                  "tf_config": "TF_CONFIG" in os.environ, "file": __file__}), flush=True)
what = sys.argv[1] if len(sys.argv) > 1 else "ok"
if what == "exit3":
    sys.exit(3)
if what == "exit_text":
    sys.exit("a message")
if what == "raise":
    def inner():
        raise ValueError("broken on purpose")
    inner()
if what == "term":
    import signal
    os.kill(os.getpid(), signal.SIGTERM)
"""


def run(tmp_path: Path, *args: str, launcher: bool) -> tuple[int, dict[str, object], str]:
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    prefix = [sys.executable, "-m", "slurmtf.run"] if launcher else [sys.executable]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [*prefix, str(script), *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith('{"argv"')]
    return done.returncode, lines[0], done.stderr


@pytest.mark.parametrize("what", ["ok", "exit3", "exit_text", "raise", "term"])
def test_the_script_runs_as_python_script_would(tmp_path: Path, what: str) -> None:
    status, seen, err = run(tmp_path, what, "--flag=1", launcher=True)
    plain_status, plain_seen, plain_err = run(tmp_path, what, "--flag=1", launcher=False)
    assert status == plain_status, (err, plain_err)
    assert (
        seen["argv"] == plain_seen["argv"] == [str(tmp_path / "user_script.py"), what, "--flag=1"]
    )
    assert seen["name"] == plain_seen["name"] == "__main__"
    assert seen["path0"] == plain_seen["path0"] == str(tmp_path)
    assert seen["file"] == plain_seen["file"]
    assert seen["tf_config"] is True
    assert plain_seen["tf_config"] is False
    if what == "raise":
        assert err.splitlines()[-1] == plain_err.splitlines()[-1] == "ValueError: broken on purpose"
        assert "slurmtf" not in err, err  # no launcher or runpy frames
        assert "runpy" not in err, err
        assert err.count("File ") == plain_err.count("File ") == 2
    if what == "exit_text":
        assert err.strip().endswith("a message")
    if what == "term":
        assert status == -signal.SIGTERM


@pytest.mark.parametrize(
    ("argv", "target"),
    [
        (["train.py", "--lr=1", "-m", "x"], Target("train.py", ("--lr=1", "-m", "x"))),
        (["--", "train.py"], Target("train.py")),
        (["-m", "pkg.train", "--x"], Target("pkg.train", ("--x",), module=True)),
        (["-mpkg.train"], Target("pkg.train", (), module=True)),
    ],
)
def test_the_launcher_options_end_at_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], target: Target
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    assert parse_target(argv) == target


@pytest.mark.parametrize(
    ("argv", "error", "words"),
    [
        ([], UsageError, "a SCRIPT or -m MODULE is required"),
        (["-m"], UsageError, "-m needs a MODULE"),
        (["--fast", "train.py"], UsageError, "unknown option '--fast'"),
        (["missing.py"], InputError, "SCRIPT='missing.py': is not a file. HINT:"),
    ],
)
def test_bad_launcher_arguments_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], error: type, words: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=None) as caught:
        parse_target(argv)
    assert words in str(caught.value)


def test_bad_slurm_variables_exit_2_before_the_script(tmp_path: Path) -> None:
    script = tmp_path / "never.py"
    script.write_text("print('ran')\n")
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "SLURM_JOB_ID": "5",
        "SLURM_PROCID": "7",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    }
    done = subprocess.run(
        [sys.executable, "-m", "slurmtf.run", str(script)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert "ran" not in done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("slurmtf run: SLURM_PROCID='7'"), line
    assert "HINT:" in line


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("python train.py --a", "python -m slurmtf.run train.py --a"),
        ("python3 -u train.py", "python3 -u -m slurmtf.run train.py"),
        (
            "python3.11 -W ignore -m pkg.train x",
            "python3.11 -W ignore -m slurmtf.run -m pkg.train x",
        ),
        ("/opt/venv/bin/python -mpkg", "/opt/venv/bin/python -m slurmtf.run -mpkg"),
        ("python -m slurmtf.run x.py", "python -m slurmtf.run x.py"),  # not twice
        ("python -c 'print(1)'", "python -c 'print(1)'"),
        ("python -", "python -"),
        ("python", "python"),
        ("bash run.sh", "bash run.sh"),
        ("torchrun x.py", "torchrun x.py"),
    ],
)
def test_submit_commands_start_python_scripts_through_the_launcher(
    command: str, expected: str
) -> None:
    assert shlex.join(through_launcher(shlex.split(command))) == expected


def test_module_jobs_run_through_the_launcher() -> None:
    spec = JobSpec(kind="module", target="pkg.train", args=("--x=1",))
    assert task_command(spec, {"lr": "2"}, python="py") == [
        "py", "-u", "-m", "slurmtf.run", "-m", "pkg.train", "--x=1", "--lr=2"
    ]  # fmt: skip
