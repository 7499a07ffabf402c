"""Ranks of one fake Slurm step on this machine, as the TensorFlow tests run them.

:class:`Cluster` / :class:`Rank` start and break ranks one by one (fault tests);
:class:`Job` is a cluster whose ranks all start at once with the same model flags, to
compare their results. Each rank's environment comes from :mod:`slurmtf.local.step`, as
for ``--cluster=local``; event lines are read with :mod:`slurmtf.events`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from slurmtf.cluster.ports import free_port_base
from slurmtf.events import named, read_events
from slurmtf.local.step import LocalStep, scrubbed_env, start_rank
from slurmtf.runtime.rank.standby import waits

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
MODEL = ("-m", "models.mnist")
SINGLE_THREADED = {
    "PYTHONUNBUFFERED": "1",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
}


@dataclass
class Rank:
    """One worker process and its output files."""

    index: int
    argv: list[str]
    env: dict[str, str]
    out: Path
    err: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    stopped: bool = False

    def start(self) -> Rank:
        # its own process group, killed by its PID
        self.proc = start_rank(self.argv, self.env, self.out, self.err, cwd=REPO, append=True)
        self.started = time.monotonic()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def wait(self, timeout: float) -> int | None:
        """Exit status, or None if still running after ``timeout`` seconds."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)
            self.stopped = signum == signal.SIGSTOP or (self.stopped and signum != signal.SIGCONT)

    def kill(self) -> None:
        """SIGCONT (if stopped) then SIGKILL to the process group we created; reap."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for signum in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signum)
        self.proc.wait(timeout=30)

    def text(self) -> str:
        parts = []
        for path in (self.out, self.err):
            if path.exists():
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        found = read_events(self.out)
        return found if name is None else named(found, name)


@dataclass
class Cluster:
    """N ranks of one fake Slurm step on ``localhost``."""

    root: Path
    size: int
    port_base: int
    job_id: int
    ranks: list[Rank] = field(default_factory=list)
    in_slurm: bool = True  # False: plain processes, no SLURM_* variables
    base_env: dict[str, str] = field(
        default_factory=lambda: {"PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "1"}
    )

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    def worker(self, index: int) -> str:
        return f"localhost:{self.port_base + index}"

    def env(self, index: int, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = scrubbed_env(extra={"PYTHONPATH": str(REPO), **self.base_env})
        if self.in_slurm:
            step = LocalStep(tasks_per_node=self.size, job_id=self.job_id, port_base=self.port_base)
            env |= step.rank_env(index)
        return env | (extra or {})

    def launch(
        self,
        index: int,
        flags: Sequence[str],
        *,
        tag: str = "",
        python_args: Sequence[str] = MODEL,
        extra_env: dict[str, str] | None = None,
    ) -> Rank:
        name = f"rank{index}{tag}"
        rank = Rank(
            index=index,
            argv=[PYTHON, *python_args, *flags],
            env=self.env(index, extra_env),
            out=self.root / f"{name}.out",
            err=self.root / f"{name}.err",
        )
        self.ranks.append(rank)
        return rank.start()

    def launch_all(self, flags: Sequence[str], *, tag: str = "") -> list[Rank]:
        return [self.launch(i, flags, tag=tag) for i in range(self.size)]

    def logs(self) -> str:
        chunks = []
        for rank in self.ranks:
            text = rank.text()
            tail = text[-6000:]
            chunks.append(f"===== {rank.out.stem} (pid {rank.proc and rank.pid}) =====\n{tail}")
        return "\n".join(chunks)

    def cleanup(self) -> None:
        for rank in self.ranks:
            rank.kill()


class Job:
    """Every rank of one model started at once with the same flags, to compare their
    results: a :class:`Cluster` of single-threaded ranks. One rank is a plain process
    outside Slurm; ``kill()`` at the end."""

    def __init__(self, tmp: Path, size: int, tag: str) -> None:
        base = free_port_base(size)
        self.tag = tag
        self.cluster = Cluster(
            root=tmp, size=size, port_base=base, job_id=40000 + base % 1000,
            in_slurm=size > 1, base_env=SINGLE_THREADED,
        )  # fmt: skip
        # The 2-core CI box can starve a rank for over TF's default 10 s heartbeat.
        self.extra = ["--heartbeat_timeout=60"] if size > 1 else []

    def start(self, model: str, flags: Sequence[str], *, ranks: Sequence[int] = ()) -> Job:
        """Start ``models.<model>`` on every rank (or only on ``ranks``)."""
        for index in ranks or range(self.cluster.size):
            self.cluster.launch(
                index,
                [*flags, *self.extra],
                tag=f"-{self.tag}",
                python_args=("-m", f"models.{model}"),
            )
        return self

    def start_script(self, script: Path, flags: Sequence[str]) -> Job:
        """Start a user's ``script`` (``python SCRIPT FLAGS``) on every rank."""
        for index in range(self.cluster.size):
            self.cluster.launch(index, flags, tag=f"-{self.tag}", python_args=(str(script),))
        return self

    @property
    def size(self) -> int:
        return self.cluster.size

    @property
    def procs(self) -> list[subprocess.Popen[bytes]]:
        return [rank.proc for rank in self.cluster.ranks if rank.proc is not None]

    def wait(self, timeout: float = 180) -> list[int]:
        """Every started rank's exit status; fails the test after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        codes = []
        for rank in self.cluster.ranks:
            code = rank.wait(max(deadline - time.monotonic(), 1))
            if code is None:
                pytest.fail(f"{self.tag}: rank did not finish in {timeout}s\n{self.logs()}")
            codes.append(code)
        return codes

    def _rank(self, index: int) -> Rank:
        return next(rank for rank in self.cluster.ranks if rank.index == index)

    def stdout(self, index: int) -> str:
        return self._rank(index).out.read_text()

    def stderr(self, index: int) -> str:
        return self._rank(index).err.read_text()

    def events(self, index: int, name: str) -> list[dict[str, Any]]:
        return self._rank(index).events(name)

    def done(self, index: int) -> dict[str, Any]:
        found = self.events(index, "done")
        assert found, f"{self.tag} rank {index} printed no done event\n{self.logs()}"
        return found[-1]

    def logs(self) -> str:
        return self.cluster.logs()

    def running(self) -> bool:
        """True while every rank is alive."""
        return all(rank.poll() is None for rank in self.cluster.ranks)

    def kill(self) -> None:
        self.cluster.cleanup()


def wait_for(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    logs: Callable[[], str],
    *,
    running: Callable[[], bool] | None = None,
) -> None:
    """Poll ``condition``; fail with ``logs()`` on timeout, or as soon as ``running()``
    turns false (the processes waited on exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if running is not None and not running():
            pytest.fail(f"exited while waiting for {what}\n{logs()}")
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{logs()}")


def checkpoint_step(model_dir: Path) -> int | None:
    """Step of the newest complete checkpoint, from TensorFlow's ``checkpoint`` state file."""
    state = model_dir / "checkpoints" / "checkpoint"
    if not state.exists():
        return None
    match = re.search(r'^model_checkpoint_path: "(?:.*/)?ckpt-(\d+)"', state.read_text(), re.M)
    return int(match.group(1)) if match else None


def progress_step(rank: Rank) -> int:
    """Highest step the rank has logged progress for (``step N/M`` lines), else 0."""
    steps = [int(m) for m in re.findall(r"step (\d+)/\d+", rank.text())]
    return max(steps, default=0)


def report(case: str, seconds: float) -> None:
    """Print a detection time; also append it to $SLURMTF_FAULT_REPORT when set."""
    line = f"DETECTED {case} {seconds:.1f}"
    print(line)
    target = os.environ.get("SLURMTF_FAULT_REPORT")
    if target:
        with Path(target).open("a") as stream:
            stream.write(line + "\n")


def final_error(rank: Rank) -> str:
    """The one-line message the model printed last on stderr (``models.mnist: ...``)."""
    lines = rank.err.read_text(errors="replace").splitlines()
    ours = [line for line in lines if line.startswith("models.mnist:")]
    return ours[-1] if ours else ""


def names_rank(message: str, cluster: Cluster, index: int) -> bool:
    """True when ``message`` names rank ``index``: its number and its host:port."""
    return bool(re.search(rf"\b(rank|task|worker) ?{index}\b", message)) and (
        cluster.worker(index) in message
    )


def checkpoint_steps(model_dir: Path) -> list[int]:
    """Steps of every checkpoint written so far (complete or not)."""
    return sorted(int(p.name[5:-6]) for p in (model_dir / "checkpoints").glob("ckpt-*.index"))


def checkpoint_values(model_dir: Path) -> dict[str, Any]:
    """Every variable of the latest checkpoint (weights, optimizer slots, step)."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(model_dir / "checkpoints"))
    skip = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map() if n not in skip}


def model_pid(job_id: str, rank: int, module: str = "models.mnist") -> int | None:
    """The process running ``module`` as ``rank`` of local job ``job_id`` (its SLURM_* env),
    not a warm one that still waits for the next attempt."""
    want = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURM_PROCID={rank}".encode()}
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = set((proc / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        marks = (i.partition(b"=")[2] for i in environ if i.startswith(b"SLURMTF_STANDBY="))
        go = next(marks, None)
        if module.encode() in cmdline and want <= environ and not waits(go):
            return int(proc.name)
    return None
