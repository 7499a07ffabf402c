"""What each kind of batch job runs on its ranks, as argument lists (no shell).

A bundled model (``python -m models.NAME`` in a checkout, ``slurmtf_models.NAME``
installed), a user's script through ``python -m slurmtf.run``, a parameter-server job
(``slurmtf serve`` on every task, the chief's script under a wrapper that writes the done
file), any command (users' own scripts through slurmtf/job.sh), or the step of a job
``slurmtf submit`` wrote. ``CONTAINER`` (or ``--container``) is put before every rank's
command; slurmtf's own steps run without it.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurmtf.contracts import INSTALL_LINE
from slurmtf.errors import InputError
from slurmtf.runtime.job.settings import MODEL_KINDS, JobSettings, JobStop
from slurmtf.runtime.rank.launcher import SUPERVISED_ENV

RUN_LAUNCHER = "slurmtf.run"
SERVE = "slurmtf.serve"
SUBMITIT_ENTRY = "submitit.core._submit"
# The chief's script of a parameter-server job runs under this, so that the servers
# stop (they watch $CHIEF_DONE) also when the script fails before its server answered.
CHIEF_WRAPPER = ("bash", "-c", 'trap : USR1 USR2; "$@"; rc=$?; touch "$CHIEF_DONE"; exit "$rc"')
FIND_MODEL = """
import importlib.util, sys
def origin(name):
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:
        spec = None
    return spec.origin if spec else None
model = origin(sys.argv[1])
if model is None:
    sys.exit(f"cannot import {sys.argv[1]}")
if origin("tensorflow") is None:
    sys.exit("has no TensorFlow")
from slurmtf.tf import install, releases
found = install.installed()
where = releases.outside(found.version) if found else None
if where == "older":
    print(install.older_error(found), file=sys.stderr)
    sys.exit(3)
if where == "newer":
    print("warning:", install.newer_line(found))
print(model)
"""
RELEASE_REFUSED = 3  # FIND_MODEL's status for a TensorFlow older than the tested range


@dataclasses.dataclass(frozen=True)
class RankCommand:
    """The command every rank runs, what srun needs besides, and the environment the
    ranks get on top of the batch script's."""

    args: tuple[str, ...]
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    kill_on_bad_exit: int = 1
    srun_args: tuple[str, ...] = ()  # the flags of submitit's srun line (its own logs)
    done_file: Path | None = None  # a parameter-server job's chief done file


def model_module(job: JobSettings) -> str:
    """models.NAME when the job's folder is a checkout with models/NAME.py (it is first
    on PYTHONPATH), else the installed slurmtf_models.NAME."""
    checkout = (job.repo / "slurmtf" / "__init__.py").is_file()
    if checkout and (job.repo / "models" / f"{job.kind}.py").is_file():
        return f"models.{job.kind}"
    return f"slurmtf_models.{job.kind}"


def find_model(job: JobSettings, env: Mapping[str, str], timeout: float = 300.0) -> str:
    """Where the model's module is, checked once with the ranks' interpreter (through
    the container): a missing model or TensorFlow is one line and exit 2 before srun."""
    module = model_module(job)
    args = [*job.container, *job.rank_python, "-c", FIND_MODEL, module]
    try:
        done = subprocess.run(
            args, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
        )
        said, ok = (done.stdout.strip() or done.stderr.strip()), done.returncode == 0
        status = done.returncode
        if status == RELEASE_REFUSED:
            said = done.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        said, ok, status = str(exc), False, None
    python = " ".join(job.rank_python)
    lines = said.splitlines() or ["did not answer"]
    if not ok and status == RELEASE_REFUSED:
        raise JobStop(f"{python}: {lines[-1]}")
    if not ok:
        raise JobStop(
            f"{python} {lines[-1]}. HINT: {python} -m {INSTALL_LINE}, "
            "or SLURMTF_REPO=<a checkout of slurmtf>"
        )
    warnings = "".join(f"; {line}" for line in lines[:-1] if line.startswith("warning:"))
    return f"{module} from {lines[-1]}{warnings}"


def rank_command(job: JobSettings, args: Sequence[str], restart: int = 0) -> RankCommand:
    """The command of a ``job.kind`` job given the job script's arguments ``args``."""
    base = (*job.container, *job.rank_python)
    if job.kind in MODEL_KINDS:
        data = [f"--data_dir={job.data_dir}"] if job.data_dir else []
        own = [f"--model_dir={job.model_dir}", f"--export_dir={job.export_dir}", *data]
        return RankCommand((*base, "-m", model_module(job), *own, *args))
    if job.kind == "command":
        bad_exit = 0 if job.servers else 1
        return RankCommand((*job.container, *_needs(job, args)), kill_on_bad_exit=bad_exit)
    if job.kind == "submitit":
        return submitit_command(job, args)
    env = {"MODEL_DIR": str(job.model_dir), "LOG_DIR": str(job.log_dir)}
    if job.kind == "train":
        if job.legacy_keras:
            env["TF_USE_LEGACY_KERAS"] = "1"
        flags = ["--cluster_flags"] if job.cluster_flags else []
        return RankCommand((*base, "-u", "-m", RUN_LAUNCHER, *flags, *_needs(job, args)), env)
    done = job.log_dir / f"chief-done.{job.job_id}.{restart}"
    env.update(SLURMTF_JOBS=job.roles, CHIEF_DONE=str(done))
    serve = (*base, "-u", "-m", SERVE, *job.serve_args, f"--done_file={done}", "--")
    chief = (*CHIEF_WRAPPER, "chief", *job.rank_python, "-u", *_needs(job, args))
    return RankCommand((*serve, *chief), env, kill_on_bad_exit=0, done_file=done)


def _needs(job: JobSettings, args: Sequence[str]) -> Sequence[str]:
    if not args:
        what = (
            "COMMAND..." if job.kind == "command" else "SCRIPT.py [ARGS...] | -m MODULE [ARGS...]"
        )
        raise JobStop(f"usage: sbatch jobs/{job.kind}.sbatch {what}")
    return args


def submitit_command(job: JobSettings, words: Sequence[str]) -> RankCommand:
    """submitit's srun line (``srun [FLAGS] PYTHON -u -m submitit.core._submit FOLDER``,
    without ``srun``): its flags, and its command behind the container prefix."""
    words = list(words)
    if SUBMITIT_ENTRY not in words:
        raise InputError(
            "slurmtf job submitit", " ".join(words[:8]), f"has no {SUBMITIT_ENTRY}",
            "it stands in for submitit's srun line: write the job again with slurmtf submit",
        )  # fmt: skip
    start = words.index(SUBMITIT_ENTRY) - 1  # its -m
    while start > 0 and words[start - 1] in ("-u", "-B", "-E", "-s"):
        start -= 1
    start = max(start - 1, 0)  # the interpreter
    env = {SUPERVISED_ENV: "1"}  # SLURMTF_SUPERVISED: on exit 75 the supervisor decides
    command = words[start:]
    if job.container:  # the image's interpreter, not the path of the submitting one
        command = [*job.container, *job.rank_python, *command[1:]]
    return RankCommand(tuple(command), env, srun_args=tuple(words[:start]))


def own_command(python: str, *args: str) -> list[str]:
    """A command of slurmtf's own (staging, the check): ``python -m slurmtf.cli ARGS``
    with the supervisor's interpreter, behind no container prefix."""
    return [python, "-m", "slurmtf.cli", *args]


def data_source(default: str, args: Sequence[str]) -> str:
    """The data set to stage: the last ``--data_dir=DIR`` or ``--data_dir DIR`` of the
    model's or script's ``args`` (as absl reads them, up to a ``--``), else ``default``."""
    found, before = default, ""
    for arg in args:
        if arg == "--":
            break
        if before == "--data_dir":
            found = arg
        elif arg.startswith("--data_dir="):
            found = arg.partition("=")[2]
        before = arg
    return found
