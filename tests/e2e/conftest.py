"""End-to-end fixtures: a real local Slurm cluster shared by the whole test session.

``slurm_sandbox`` (session scope) starts one sandbox (3 nodes ``node1..node3``, 2 fake
GPUs each) in a pytest temporary directory and stops it at the end. Its API:

- ``.dir`` (Path): the sandbox's state directory; ``.sandbox``: the
  :class:`slurmtf.sandbox.Sandbox`; ``.nodes``, ``.gpus_per_node``.
- ``.env`` (dict): ``os.environ`` plus ``SLURM_CONF`` and the sacct shim first on
  ``PATH``; pass it as ``env=`` to any subprocess that runs Slurm commands or submitit.
- ``.run(args, timeout=60, check=True, cwd=REPO, env=None)`` -> ``CompletedProcess``:
  run a command with ``.env`` (plus ``env`` overrides); on failure raises with
  stdout, stderr and the daemon log tails.
- ``.submit(script, *args, sbatch_args=(), env=None, cwd=REPO)`` -> job id (str):
  ``sbatch --parsable [sbatch_args] script [args]``; ``env`` adds variables.
- ``.wait(job_id, timeout=120)`` -> final state (``COMPLETED``, ``FAILED``, ...):
  polls until the job ends (a requeued job is followed to its end); on timeout the
  job is cancelled and ``TimeoutError`` carries ``.logs(job_id)``.
- ``.state(job_id)`` -> current state or ``""``; ``.logs(job_id)`` -> text with
  ``scontrol show job`` and the daemon log tails, for failure messages.

``recovery_sandbox`` (session scope, started when first asked for) is a second one with
the same API, where a requeue costs what it does on a real cluster (``cred_expire=120``).

Tests that need it carry ``@pytest.mark.slurm``. A missing prerequisite (root,
unshare, Slurm that cannot be installed) skips locally and fails in CI
(``SLURMTF_STRICT_PREREQS=1``).
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from slurmtf.contracts import FINAL_STATES
from slurmtf.sandbox import Sandbox
from slurmtf.sandbox.daemons import log_tail
from slurmtf.slurm.scontrol import parse_records
from tests.prereqs import require

if TYPE_CHECKING:
    from tests.e2e.jobruns import SandboxJob

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
TERMINAL = frozenset(FINAL_STATES)


def require_sandbox_prereqs() -> None:
    require(sys.platform.startswith("linux"), "Linux")
    require(os.geteuid() == 0, "root (the sandbox runs slurmctld/slurmd and mounts)")
    require(shutil.which("unshare") is not None, "unshare (util-linux)")
    have_slurm = all(
        shutil.which(b) or Path(f"/usr/sbin/{b}").exists()
        for b in ("slurmctld", "slurmd", "sbatch", "munged")
    )
    require(have_slurm or shutil.which("apt-get") is not None, "Slurm, or apt-get to install it")


class SlurmSandbox:
    """A running sandbox plus helpers to submit and follow jobs (see module doc)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.dir = sandbox.dir
        self.nodes = sandbox.nodes
        self.gpus_per_node = sandbox.gpus_per_node
        self.env: dict[str, str] = sandbox.env()
        self.env.setdefault("PYTHON", PYTHON)

    def run(
        self,
        args: Sequence[str],
        timeout: float = 60,
        check: bool = True,
        cwd: Path | str = REPO,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        full_env = {**self.env, **(env or {})}
        done = subprocess.run(
            list(args), env=full_env, cwd=cwd, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} exited {done.returncode}\n--- stdout:\n{done.stdout}\n"
                f"--- stderr:\n{done.stderr}\n{self.daemon_logs()}"
            )
        return done

    def submit(
        self,
        script: Path | str,
        *args: str,
        sbatch_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: Path | str = REPO,
    ) -> str:
        done = self.run(
            ["sbatch", "--parsable", *sbatch_args, str(script), *args], cwd=cwd, env=env
        )
        return done.stdout.strip().split(";")[0]

    def state(self, job_id: str) -> str:
        done = self.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], check=False)
        return done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""

    def wait(self, job_id: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state(job_id)
            if state in TERMINAL:
                return state
            time.sleep(0.5)
        logs = self.logs(job_id)
        self.run(["scancel", job_id], check=False)
        raise TimeoutError(f"job {job_id} still {self.state(job_id)!r} after {timeout}s\n{logs}")

    def end_time(self, job_id: str) -> float:
        """When the job ended (epoch seconds; Slurm keeps whole seconds, rounded down)."""
        show = self.run(["scontrol", "-o", "show", "job", job_id])
        stamp = parse_records(show.stdout)[0]["EndTime"]
        return datetime.datetime.fromisoformat(stamp).timestamp()

    def logs(self, job_id: str) -> str:
        show = self.run(["scontrol", "show", "job", job_id], check=False)
        return f"--- scontrol show job {job_id}:\n{show.stdout}{show.stderr}\n{self.daemon_logs()}"

    def daemon_logs(self, lines: int = 15) -> str:
        parts = []
        for log in sorted((self.dir / "log").glob("*.log")):
            if log.name != "jobcomp.log":
                parts.append(f"--- {log}:\n{log_tail(log, lines)}")
        return "\n".join(parts)


def module_sandbox(
    tmp_path_factory: pytest.TempPathFactory, name: str, **settings: Any
) -> Iterator[SlurmSandbox]:
    """A sandbox of a test module's own (``settings``: :class:`Sandbox`'s, e.g. ``nodes``,
    ``slurmd_timeout``), for a module-scoped fixture to ``yield from``; down afterwards."""
    require_sandbox_prereqs()
    sandbox = Sandbox(tmp_path_factory.mktemp(name), **settings)
    sandbox.up()
    try:
        yield SlurmSandbox(sandbox)
    finally:
        sandbox.down()


@pytest.fixture(scope="session")
def slurm_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    """One 3-node sandbox with 2 fake GPUs per node for the whole session.

    ``SLURMTF_TEST_LINK=1gbit`` (any ``--link`` value) runs the whole suite with nodes
    on shaped links of their own instead of loopback.
    """
    require_sandbox_prereqs()
    link = os.environ.get("SLURMTF_TEST_LINK", "")
    sandbox = Sandbox(tmp_path_factory.mktemp("slurm"), nodes=3, gpus_per_node=2, link=link)
    sandbox.up()
    try:
        yield SlurmSandbox(sandbox)
    finally:
        sandbox.down()


@pytest.fixture(scope="session")
def recovery_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    """A 3-node sandbox where a requeue costs what it costs on a real cluster, for the
    recovery tests: Slurm's default ``cred_expire`` (120 s: a requeued job may not start
    again before then), ``SlurmdTimeout`` 120 s (a recovery that waits for Slurm to
    declare a node failed shows), and nodes with network namespaces of their own (a
    frozen rank keeps its port on its node only, as on separate machines)."""
    require_sandbox_prereqs()
    sandbox = Sandbox(
        tmp_path_factory.mktemp("realistic"),
        nodes=3,
        link="unshaped",
        slurmd_timeout=120,
        cred_expire=120,
    )
    sandbox.up()
    try:
        yield SlurmSandbox(sandbox)
    finally:
        sandbox.down()


@pytest.fixture(scope="session")
def baseline(
    slurm_sandbox: SlurmSandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """The uninterrupted run of ``jobruns.ARGS``, submitted when first asked for so that
    it overlaps the first test; the preemption and recovery tests compare with it."""
    from tests.e2e.jobruns import ARGS, SandboxJob

    job = SandboxJob(slurm_sandbox, tmp_path_factory.mktemp("preempt") / "baseline")
    job.submit(ARGS)
    yield job
    job.cancel()


def tracked_jobs() -> Iterator[list[SandboxJob]]:
    """The jobs a test appends: cancelled and released at the end, each job's report
    printed (shown by pytest only when the test failed). Needs TensorFlow."""
    require(importlib.util.find_spec("tensorflow") is not None, "TensorFlow (pip install .[cpu])")
    made: list[SandboxJob] = []
    yield made
    for job in made:
        job.cancel()
        job.release()
    for job in made:
        if job.job_id:
            print(job.report())


@pytest.fixture
def jobs(slurm_sandbox: SlurmSandbox, tmp_path: Path) -> Iterator[list[SandboxJob]]:
    """Live jobs a test breaks (``tests.e2e.jobruns.new_job``): cancelled at the end."""
    yield from tracked_jobs()
