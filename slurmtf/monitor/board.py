"""TensorBoard over a job's runs: the library behind ``slurmtf tensorboard JOB|DIR``.

:func:`job_runs` finds a job's summary folders from its id (the ``--model_dir`` the
chief writes TensorBoard summaries into, and any folder flag a script's own TensorBoard
callback was given, read from rank 0's ``launch`` events), one run per array task for a
sweep, named by the task's parameters. :func:`folder_runs` takes a folder as it is.
:class:`Links` is the folder TensorBoard reads: a link per run, named by it, kept up to
date while TensorBoard runs, so that a job array's tasks that start later show up
without a restart. :func:`logdir_spec` (the same runs as one command line, for
``--dry_run``), :func:`board_command` and :func:`ssh_line` are functions of values;
:func:`serve` starts TensorBoard and looks for new runs until it ends. TensorBoard runs
without TensorFlow (its ``notf`` stub), so this never imports TensorFlow, whether or not
it is installed.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from slurmtf.errors import InputError, SlurmtfError
from slurmtf.events import named, read_events
from slurmtf.monitor import records as jobrecord
from slurmtf.monitor.plot import runs_of
from slurmtf.monitor.records import JobPlace
from slurmtf.monitor.slurm_view import SlurmView, ask_slurm
from slurmtf.monitor.status import locate
from slurmtf.monitor.sweeps import slurm_tasks
from slurmtf.slurm.runner import Runner

EVENTS_GLOB = "events.out.tfevents.*"
INSTALL_LINE = "pip install 'slurmtf[tensorboard]'"
# Flags of the launched command that name a folder summaries may be written to.
FOLDER_FLAGS = ("model_dir", "logdir", "log_dir", "tensorboard_dir", "summary_dir", "tb_dir")
STOP_WAIT_S = 10.0
REFRESH_S = 30.0  # how often serve() looks for new runs (a sweep's later tasks)
# TensorBoard's own entry point with its TensorFlow stub forced: TensorFlow, when it is
# installed, is not imported (seconds of start-up and memory on a login node).
NOTF_MAIN = (
    "import sys, types; sys.modules['tensorboard.compat.notf'] = types.ModuleType('notf'); "
    "from tensorboard.main import run_main; run_main()"
)


@dataclasses.dataclass(frozen=True)
class Run:
    """One named folder of summaries (a TensorBoard run group)."""

    name: str
    path: Path


def has_summaries(folder: Path) -> bool:
    """Whether ``folder`` holds a TensorBoard event file, at any depth."""
    return folder.is_dir() and next(folder.rglob(EVENTS_GLOB), None) is not None


def folder_flags(command: Sequence[object]) -> list[Path]:
    """The folders named by ``--model_dir=D`` / ``--model_dir D`` (and the other
    :data:`FOLDER_FLAGS`) in a launched command, in order."""
    words = [str(w) for w in command]
    found = []
    for index, word in enumerate(words):
        name, eq, value = word.removeprefix("--").partition("=")
        if not word.startswith("--") or name.replace("-", "_") not in FOLDER_FLAGS:
            continue
        if not eq and index + 1 < len(words) and not words[index + 1].startswith("-"):
            value = words[index + 1]
        if value:
            found.append(Path(value).expanduser())
    return found


def summary_folders(place: JobPlace) -> list[Path]:
    """A job's (or array task's) folders with summaries: the ``model_dir`` the job
    scripts record, the folder flags of rank 0's launched commands, and
    ``<log folder>/<job>_model`` (``slurmtf submit``'s default)."""
    recorded = place.model_dir or getattr(jobrecord.lookup(place.job_id), "model_dir", None)
    candidates = [recorded] if recorded else []
    for launch in named(read_events(place.rank_log(0)), "launch"):
        command = launch.get("command")
        candidates += folder_flags(command) if isinstance(command, list) else []
    candidates.append(place.log_dir / f"{place.job_id}_model")
    found: list[Path] = []
    for given in candidates:
        folder = given if given.is_absolute() else place.log_dir / given
        # the log folder itself holds other jobs' model folders: never taken whole
        if folder != place.log_dir and folder not in found and has_summaries(folder):
            found.append(folder)
    return found


def param_label(place: JobPlace) -> str:
    """``lr=0.1 batch_size=64``: the task's parameters from its ``launch`` event."""
    launches = named(read_events(place.rank_log(0)), "launch")
    params = launches[-1].get("params") if launches else None
    if not isinstance(params, dict):
        return ""
    return " ".join(f"{k}={v}" for k, v in params.items())


def run_name(text: str) -> str:
    """A run name TensorBoard's ``--logdir_spec`` keeps whole (no ``,`` or ``:``)."""
    return text.replace(",", ";").replace(":", "_").strip() or "run"


def array_places(
    job_id: str, runner: Runner, log_dir: str | None, view: SlurmView
) -> list[JobPlace]:
    """The places of array ``job_id``'s tasks (Slurm's and the record's), or ``[]``."""
    if not job_id.isdigit():
        return []
    recorded = jobrecord.array_tasks(job_id)
    tasks = sorted(set(slurm_tasks(job_id, view.records or [])) | set(recorded))
    places = []
    for task in tasks:
        place = recorded.get(task) if not log_dir else None
        if place is None:
            place = locate(f"{job_id}_{task}", runner, log_dir, view if view.silent else None)
        places.append(place)
    return places


def task_runs(tasks: Sequence[tuple[JobPlace, str]]) -> list[Run]:
    """One run per summary folder of each task, named by its parameters (the task id
    where parameters are missing or repeat; a folder's name where a task has several)."""
    labels = [run_name(label) for _, label in tasks]
    runs = []
    for (place, _), label in zip(tasks, labels, strict=True):
        name = label if label != "run" and labels.count(label) == 1 else place.job_id
        folders = summary_folders(place)
        for folder in folders:
            suffix = f" {run_name(folder.name)}" if len(folders) > 1 else ""
            runs.append(Run(name + suffix, folder))
    return runs


def job_runs(
    job_id: str, runner: Runner, log_dir: str | None = None, view: SlurmView | None = None
) -> tuple[list[Run], list[JobPlace]]:
    """The runs of job ``job_id`` and the places looked in (one per array task).

    Raises :class:`~slurmtf.errors.InputError` when the job has no record (no logs where
    Slurm, the record of submitted jobs or ``log_dir`` point) or no summaries yet."""
    view = view or (SlurmView(None) if log_dir else ask_slurm(job_id, runner))
    places = array_places(job_id, runner, log_dir, view)
    if places:
        tasks = [(place, param_label(place)) for place in places]
    else:
        place = locate(job_id, runner, log_dir, view)
        tasks = runs_of(place)
        if not tasks:
            raise InputError(
                "JOB", job_id, f"has no record and no logs in {place.log_dir} (via {place.source})",
                "pass --log_dir= as given to submit, or the summary folder itself: "
                "slurmtf tensorboard DIR",
            )  # fmt: skip
        tasks = [(p, "" if len(tasks) == 1 else label) for p, label in tasks]
    runs = task_runs(tasks)
    if len(tasks) == 1 and len(runs) == 1:
        runs = [Run(job_id, runs[0].path)]
    if not runs:
        where = ", ".join(str(p.log_dir / f"{p.job_id}_model") for p, _ in tasks[:3])
        raise InputError(
            "JOB", job_id, f"has no TensorBoard summaries ({EVENTS_GLOB}) yet, e.g. in {where}",
            "the chief writes them into --model_dir from its first steps; for a script's "
            "own TensorBoard callback, pass its folder: slurmtf tensorboard DIR",
        )  # fmt: skip
    return runs, [p for p, _ in tasks]


def folder_runs(folder: str) -> list[Run]:
    """``slurmtf tensorboard DIR``: the folder as one run group named after it."""
    path = Path(folder).expanduser().absolute()
    if not path.is_dir():
        raise InputError("DIR", folder, "is not a folder", "pass a job id or a summary folder")
    if not has_summaries(path):
        raise InputError(
            "DIR", folder, f"holds no TensorBoard summaries ({EVENTS_GLOB} at any depth)",
            "pass the --model_dir of a run, or the folder given to a TensorBoard callback",
        )  # fmt: skip
    return [Run(run_name(path.name), path)]


def logdir_spec(runs: Sequence[Run]) -> str:
    """TensorBoard's ``--logdir_spec``: ``name:path,...`` (a path with a ``,`` cannot be
    given to TensorBoard: an error saying so)."""
    for run in runs:
        if "," in str(run.path):
            raise InputError(
                "folder", str(run.path), "has a ',' that TensorBoard's --logdir_spec splits at",
                "rename the folder or link it from a path without one",
            )  # fmt: skip
    return ",".join(f"{run.name}:{run.path}" for run in runs)


def link_name(name: str) -> str:
    """A run's name as one entry of a folder (no ``/``, not hidden)."""
    return name.replace(os.sep, "_").lstrip(".") or "run"


class Links:
    """The folder TensorBoard reads (``--logdir``): one symbolic link per run, named by
    it, in a temporary folder of its own (TensorBoard's file walk follows links). New runs
    are linked as they appear; the folder is removed at the end, never what it links to."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @classmethod
    def create(cls) -> Links:
        return cls(Path(tempfile.mkdtemp(prefix="slurmtf-board-")))

    def update(self, runs: Sequence[Run]) -> list[str]:
        """Link every run not linked yet (a link whose run moved is pointed at its new
        folder); the names of the runs linked now."""
        added = []
        for run in runs:
            link = self.folder / link_name(run.name)
            if link.is_symlink() and link.readlink() == run.path:
                continue
            if link.is_symlink():
                link.unlink()
            link.symlink_to(run.path, target_is_directory=True)
            added.append(run.name)
        return added

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def free_port(bind: str) -> int:
    """A port nothing listens on at ``bind`` now (the OS's choice)."""
    with socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET) as sock:
        sock.bind((bind, 0))
        port: int = sock.getsockname()[1]
        return port


def board_command(
    logdir: str, port: int, bind: str, python: str = sys.executable, *, spec: bool = False
) -> list[str]:
    """The TensorBoard command line (TensorFlow stubbed out) over the folder ``logdir``,
    or with ``spec`` over a ``--logdir_spec`` value (``name:path,...``: :func:`logdir_spec`)."""
    flag = "--logdir_spec" if spec else "--logdir"
    return [python, "-c", NOTF_MAIN, flag, logdir, "--port", str(port), "--host", bind]


def ssh_line(port: int, bind: str = "localhost", user: str = "", host: str = "") -> str:
    """The one line to run on a laptop: ``ssh -L PORT:localhost:PORT USER@HOST`` (this
    user and host by default; a TensorBoard bound to one address is reached there)."""
    target = "localhost" if bind in {"localhost", "127.0.0.1", "0.0.0.0", "::", "::1"} else bind
    user = user or getpass.getuser()
    host = host or socket.gethostname()
    return f"ssh -L {port}:{target}:{port} {user}@{host}"


def check_installed() -> None:
    """TensorBoard's package is there, or one line saying how to install it."""
    try:
        import tensorboard  # noqa: F401
    except ImportError as exc:
        raise SlurmtfError(f"tensorboard is not installed. HINT: {INSTALL_LINE}") from exc


def serve(
    command: Sequence[str],
    links: Links | None = None,
    runs: Callable[[], Sequence[Run]] | None = None,
    say: Callable[[str], None] = print,
) -> int:
    """Run TensorBoard until it ends or Ctrl-C; Ctrl-C stops it (bounded wait) and is 0.
    Every :data:`REFRESH_S` s the job's ``runs`` are looked up again and new ones linked
    into ``links`` (a lookup that fails, Slurm silent say, is tried at the next look)."""
    process = subprocess.Popen(list(command))
    try:
        while True:
            try:
                return process.wait(REFRESH_S if runs is not None else None)
            except subprocess.TimeoutExpired:
                _refresh(links, runs, say)
    except KeyboardInterrupt:
        process.terminate()
        try:
            process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        return 0


def _refresh(
    links: Links | None, runs: Callable[[], Sequence[Run]] | None, say: Callable[[str], None]
) -> None:
    if links is None or runs is None:
        return
    try:
        added = links.update(runs())
    except (SlurmtfError, OSError):
        return
    if added:
        say(f"slurmtf: new run(s) in TensorBoard: {', '.join(added)}")
