"""slurmtf installed from its wheel, not cloned: what a pip user runs, from their own folder.

The module builds the wheel, installs it (not editable, ``--no-deps``) into a fresh
virtual environment that sees this machine's TensorFlow (``--system-site-packages``),
and runs everything from an empty folder outside the checkout with ``PYTHONPATH`` unset:
``slurmtf sandbox up`` (this module's sandbox), ``slurmtf job-scripts .``, ``slurmtf
data``, the written ``mnist.sbatch`` and ``train.sbatch`` with a script of that folder,
``slurmtf submit --model=mnist --wait`` and ``slurmtf status|logs``. Every path that
code was loaded from (module files, the model the job script found, ``sys.path`` of a
rank, the interpreter each task ran) is checked to lie outside the checkout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurmtf.cluster.ports import free_port_base
from slurmtf.events import named, read_events
from slurmtf.sandbox import Sandbox
from tests.e2e.conftest import REPO, SlurmSandbox, require_sandbox_prereqs
from tests.e2e.jobruns import SandboxJob, check_training
from tests.prereqs import require

pytestmark = [pytest.mark.slurm, pytest.mark.tf]

STEPS = ["--train_steps=4", "--batch_size=16", "--eval_steps=1", "--log_every=2",
         "--num_threads=1", "--seed=3"]  # fmt: skip
# The user's own script for train.sbatch: where its code came from, on every rank.
USER_SCRIPT = """\
import json, sys
import slurmtf, slurmtf_models
from slurmtf.resolver import resolve
layout = resolve()
print(json.dumps({"event": "user", "rank": layout.task_index, "workers": layout.num_workers,
                  "argv": sys.argv[1:], "files": [slurmtf.__file__, slurmtf_models.__file__],
                  "path": sys.path, "executable": sys.executable}))
"""
# Variables that would let the checkout in, or point at another sandbox or install.
UNSET = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "SLURMTF_REPO", "SLURMTF_SUPERVISED",
         "SLURMTF_JOB_SH", "SLURM_CONF", "SLURMTF_SANDBOX_DIR", "VIRTUAL_ENV")  # fmt: skip


@dataclass(frozen=True)
class Install:
    """The virtual environment with the wheel, and the user's (empty) folder."""

    venv: Path
    home: Path  # the user's folder: cwd and submit directory of everything here
    env: dict[str, str]  # the user's shell: the venv first on PATH, no PYTHONPATH

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def run(
        self, *args: str | Path, env: Mapping[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(a) for a in args], cwd=self.home, env={**self.env, **(env or {})},
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (
            f"{args} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
        return done


def outside_checkout(path: str | Path) -> bool:
    return not Path(path).resolve().is_relative_to(REPO)


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Install:
    require_sandbox_prereqs()
    require(importlib.util.find_spec("tensorflow") is not None, "TensorFlow (pip install .[cpu])")
    root = tmp_path_factory.mktemp("installed")
    assert outside_checkout(root)
    venv = root / "venv"
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHON"] = str(venv / "bin" / "python")
    env["XDG_STATE_HOME"] = str(root / "state")  # this user's record of jobs
    steps = [
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(root / "wheel"), str(REPO)],
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
        # --force-reinstall: the editable install of the checkout has the same version
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         "--force-reinstall", "--find-links", str(root / "wheel"), "slurmtf"],
    ]  # fmt: skip
    for step in steps:
        subprocess.run(step, env=env, capture_output=True, text=True, timeout=300, check=True)
    home = root / "home"
    home.mkdir()
    return Install(venv, home, env)


@pytest.fixture(scope="module")
def sandbox(install: Install) -> Iterator[SlurmSandbox]:
    """A 2-node sandbox started and stopped by the installed ``slurmtf sandbox``."""
    state = install.home.parent / "sandbox"
    install.run("slurmtf", "sandbox", "up", "--dir", state, "--nodes", "2", timeout=120)
    box = SlurmSandbox(Sandbox(state, nodes=2, gpus_per_node=2))
    box.env = box.sandbox.env(base=install.env)
    try:
        yield box
    finally:
        done = subprocess.run(
            ["slurmtf", "sandbox", "down", "--dir", str(state)], env=install.env,
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            box.sandbox.down()


def test_the_installed_package_is_the_wheel_and_writes_the_job_scripts(install: Install) -> None:
    found = install.run(
        install.python, "-c",
        "import json, sys, slurmtf, slurmtf_models; "
        "print(json.dumps([slurmtf.__file__, slurmtf_models.__file__, sys.path]))",
    )  # fmt: skip
    slurmtf_file, models_file, path = json.loads(found.stdout)
    for name in (slurmtf_file, models_file):
        assert Path(name).is_relative_to(install.venv), name
    assert all(outside_checkout(entry) for entry in path if entry), path

    listed = install.run("slurmtf", "job-scripts", "--list").stdout
    assert [line.split()[0] for line in listed.splitlines()] == [
        "mnist.sbatch", "parameter_server.sbatch", "resnet.sbatch", "train.sbatch",
    ]  # fmt: skip
    install.run("slurmtf", "job-scripts", ".")
    for script in ("mnist.sbatch", "parameter_server.sbatch", "resnet.sbatch", "train.sbatch"):
        written = (install.home / script).read_text()
        assert written == (REPO / "jobs" / script).read_text(), script
    again = install.run("slurmtf", "job-scripts", ".").stdout  # identical files: fine
    assert again.count("same") == 4, again
    explained = install.run("slurmtf", "resolve", "--explain").stdout
    assert "single local worker" in explained, explained


def test_job_scripts_run_from_the_users_folder(install: Install, sandbox: SlurmSandbox) -> None:
    install.run("slurmtf", "job-scripts", ".")
    data = install.home / "data"
    install.run("slurmtf", "data", "sample-mnist", data)
    (install.home / "my_script.py").write_text(USER_SCRIPT)
    runs = install.home / "runs"
    mnist = SandboxJob(sandbox, runs / "mnist", scripts=install.home, submit_dir=install.home)
    mnist.submit(STEPS, env={"DATA_DIR": str(data)})
    own = SandboxJob(sandbox, runs / "own", scripts=install.home, submit_dir=install.home)
    own.submit(["my_script.py", "--lr=0.1"], script="train.sbatch")

    check_training(mnist, loss_falls=False)
    (cluster,) = mnist.of("cluster")[0]
    assert cluster["synthetic"] is False, cluster  # it read the data `slurmtf data` wrote
    model_line = next(ln for ln in mnist.job_output().splitlines() if " model " in ln)
    model_file = model_line.split(" from ")[-1]
    assert " model slurmtf_models.mnist from " in model_line, model_line
    assert Path(model_file).is_relative_to(install.venv), model_line

    assert own.finish() == "COMPLETED", own.report()
    for rank in range(2):
        (user,) = own.of("user")[rank]
        assert (user["rank"], user["workers"], user["argv"]) == (rank, 2, ["--lr=0.1"])
        assert Path(user["executable"]).is_relative_to(install.venv), user
        assert all(Path(f).is_relative_to(install.venv) for f in user["files"]), user
        assert all(outside_checkout(entry) for entry in user["path"] if entry), user


def test_submit_waits_for_the_installed_model(install: Install, sandbox: SlurmSandbox) -> None:
    ports = {"SLURMTF_PORT_BASE": str(free_port_base(8))}  # sbatch exports it to the job
    done = install.run(
        "slurmtf", "submit", "--model=mnist", "--nodes=2", "--time=10", "--wait",
        "--", *STEPS, env={**sandbox.env, **ports}, timeout=300,
    )  # fmt: skip
    match = re.search(r"submitted job (\d+)", done.stdout)
    assert match, done.stdout
    job = match.group(1)
    logs = install.home / "slurmtf_logs"
    for rank in range(2):
        (launch,) = named(read_events(logs / f"{job}_{rank}_log.out"), "launch")
        command = launch["command"]
        assert command[0] == str(install.python), command
        assert command[2:4] == ["-m", "slurmtf_models.mnist"], command
        assert all(outside_checkout(arg) for arg in command if arg.startswith("/")), command
        (finished,) = named(read_events(logs / f"{job}_{rank}_log.out"), "done")
        assert finished["step"] == 4, finished
    status = install.run("slurmtf", "status", job, env=sandbox.env).stdout
    assert "COMPLETED" in status, status
    assert (
        '"event": "done"' in install.run("slurmtf", "logs", job, "--json", env=sandbox.env).stdout
    )
