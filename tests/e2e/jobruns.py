"""Sandbox training jobs shared by the end-to-end tests: submit, collect events, check.

``SandboxJob`` is one job of ``jobs/<script>``: ``submit``, ``finish`` (wait, then read
every rank's JSON event lines), and for the fault, preemption and recovery tests its
state while it runs and a rank's process, found through ``/proc`` by job id and rank
(``rank_pids``) and signalled by PID. ``submit_job`` submits one; ``check_training``
asserts what every healthy training job shows (one cluster, falling loss, equal weights
on every rank, chief-only outputs).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from slurmtf.events import Event, named, read_events
from slurmtf.runtime.batch_host.heartbeat import Beat, beat_path, read_beat
from slurmtf.runtime.rank.standby import waits
from slurmtf.training.allocation import STATE_NAME as ALLOCATION_STATE
from slurmtf.training.checkpoints import WORKERS_FILE
from slurmtf.training.export import AllocationWriter
from tests.e2e.conftest import PYTHON, REPO, TERMINAL, SlurmSandbox

# The MNIST job the preemption and recovery tests interrupt: deterministic, checkpoints
# every INTERVAL steps, ends at STEPS.
STEPS = 120
INTERVAL = 10  # --checkpoint_every
ARGS = [
    "--batch_size=16",
    "--eval_steps=1",
    "--num_threads=1",
    "--seed=11",
    "--dropout_rate=0",
    "--log_every=1",
    f"--train_steps={STEPS}",
    f"--checkpoint_every={INTERVAL}",
    "--heartbeat_timeout=10",
]
# A successful job ends cleanly: no error-level line (TensorFlow's `E0000 ...`) in any
# rank's log, and the job ends within this many seconds of rank 0's last line: a rank
# that does not leave with the others waits for a heartbeat timeout (10 s and more). The
# measured seconds (about 1-2 on a quiet machine, 3.1 seen with 2 test workers and the
# matrix beside them) are printed (MEASURED teardown_...); their target is benchmarks'.
CLEAN_END_S = 6.0
ERROR_LINE = re.compile(r"^E\d{4} .*$", re.MULTILINE)
FAST = ["--batch_size=16", "--eval_steps=1", "--num_threads=1", "--seed=5"]
LONG = [*FAST, "--train_steps=100000", "--log_every=5", "--checkpoint_every=10"]


@dataclass
class SandboxJob:
    """One job of a job script (``jobs/*.sbatch``) in the sandbox: its state, its files,
    its ranks' event lines and processes."""

    sandbox: SlurmSandbox
    run_dir: Path
    job_id: str = ""
    nodes: int = 2
    tasks: int = 2
    timeout: float = 400.0  # for finish(): several TensorFlow jobs share 2 cores
    model_path: Path | None = None  # default: run_dir/model
    logs_path: Path | None = None  # default: run_dir/logs
    final: str = ""  # kept: squeue forgets a finished job after MinJobAge
    rank_events: dict[int, list[Event]] = field(default_factory=dict)  # read by finish()
    signalled: list[int] = field(default_factory=list)
    scripts: Path = REPO / "jobs"  # where the job script is; submitted from submit_dir
    submit_dir: Path = REPO

    @property
    def model_dir(self) -> Path:
        return self.model_path or self.run_dir / "model"

    @property
    def log_dir(self) -> Path:
        return self.logs_path or self.run_dir / "logs"

    def submit(
        self,
        args: Sequence[str],
        *,
        script: str = "mnist.sbatch",
        tasks_per_node: int | None = 1,
        nodelist: str = "",
        sbatch_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        node_range: str = "",
    ) -> str:
        """``sbatch <scripts>/<script> ARGS`` (``jobs/`` of the checkout by default) on
        ``nodes`` nodes with this job's folders; ``node_range`` (``2-3``): ``--nodes=``
        that range and no task count, as a user submits a range job; ``tasks_per_node``
        None: no task count either (the script's own, one task per GPU)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        count = [] if tasks_per_node is None else [f"--ntasks-per-node={tasks_per_node}"]
        shape = [f"-N{self.nodes}", *count]
        sbatch = [
            *([f"--nodes={node_range}"] if node_range else shape), "--time=30",
            f"--job-name={self.run_dir.name}", f"--output={self.run_dir}/%x-%j.out",
        ]  # fmt: skip
        if nodelist:
            sbatch.append(f"--nodelist={nodelist}")
        run_env = {"MODEL_DIR": str(self.model_dir), "LOG_DIR": str(self.log_dir), **(env or {})}
        self.tasks = self.nodes * (tasks_per_node or 0)  # 0: as Slurm and the script decide
        self.final, self.rank_events = "", {}
        self.job_id = self.sandbox.submit(
            self.scripts / script,
            *args,
            sbatch_args=[*sbatch, *sbatch_args],
            env=run_env,
            cwd=self.submit_dir,
        )
        return self.job_id

    def finish(self) -> str:
        """Wait up to ``timeout`` for the end, then read every rank's event lines."""
        state = self.wait(self.timeout)
        if not self.rank_events:
            for path in sorted(self.log_dir.glob("rank*.out")):
                self.rank_events[int(path.stem.removeprefix("rank"))] = read_events(path)
        return state

    def of(self, event: str) -> dict[int, list[Event]]:
        """Each rank's ``event`` lines, as :meth:`finish` read them."""
        return {rank: named(found, event) for rank, found in self.rank_events.items()}

    def state(self) -> str:
        if not self.final:
            state = self.sandbox.state(self.job_id)
            if state not in TERMINAL:
                return state
            self.final = state
        return self.final

    def wait(self, timeout: float) -> str:
        """The final state (kept); on timeout the job is cancelled, its logs in the error."""
        if not self.final:
            try:
                self.final = self.sandbox.wait(self.job_id, timeout)
            except TimeoutError as exc:
                raise TimeoutError(f"{exc}\n{self.report()}") from None
        return self.final

    def cancel(self) -> None:
        if self.job_id and self.state() not in TERMINAL:
            self.sandbox.run(["scancel", self.job_id], check=False)

    def rank_pid(self, rank: int) -> int | None:
        """PID of this job's ``python -m models.mnist`` for ``rank``, found in /proc."""
        for pid in rank_pids(self.job_id, rank):
            return pid
        return None

    def signal_rank(self, rank: int, signum: int) -> int:
        pid = self.rank_pid(rank)
        assert pid is not None, f"no process for rank {rank} of job {self.job_id}\n{self.report()}"
        os.kill(pid, signum)
        self.signalled.append(pid)
        return pid

    def rank_node(self, rank: int) -> str:
        """The node ``rank``'s process runs on (its ``SLURMD_NODENAME``)."""
        pid = self.rank_pid(rank)
        assert pid is not None, self.report()
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if item.startswith(b"SLURMD_NODENAME="):
                return item.split(b"=", 1)[1].decode()
        raise AssertionError(f"rank {rank} has no SLURMD_NODENAME\n{self.report()}")

    def release(self) -> None:
        """Resume and kill every process this test stopped (by PID), if still there."""
        for pid in self.signalled:
            for signum in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)

    def text(self, name: str) -> str:
        path = self.log_dir / name
        return path.read_text(errors="replace") if path.exists() else ""

    def job_output(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.run_dir.glob("*.out")))

    def events(self, rank: int, name: str) -> list[Event]:
        """Rank ``rank``'s ``name`` lines so far (read now, while the job runs)."""
        return named(read_events(self.log_dir / f"rank{rank}.out"), name)

    def progress(self) -> int:
        """Highest step rank 0 has logged (``step N/M``), else 0."""
        steps = [
            int(word.split("/")[0])
            for line in self.text("rank0.err").splitlines()
            for word in line.split("step ")[1:2]
            if word.split("/")[0].isdigit()
        ]
        return max(steps, default=0)

    def report(self) -> str:
        parts = [f"job {self.job_id} state {self.state()!r}, run dir {self.run_dir}"]
        parts.append(f"--- job output:\n{self.job_output()[-3000:]}")
        for path in sorted(self.log_dir.glob("rank*")):
            parts.append(f"--- {path.name}:\n{path.read_text(errors='replace')[-3000:]}")
        parts.append(self.sandbox.logs(self.job_id))
        return "\n".join(parts)


def first_count(limit: str) -> str:
    """The regex of the first restart's count in the job's log (docs/FAILURES.md, "What
    the budget counts"): no cost when the attempt reached a step (the bundled models'
    ``progress`` events), one failure without progress when it reported none (a Keras
    ``fit`` script, a rank that failed before its first step)."""
    return (
        rf"(?:0 of {limit} without progress: training reached step \d+"
        rf"|1 of {limit} without progress)"
    )


def submit_job(
    sandbox: SlurmSandbox,
    root: Path,
    name: str,
    *,
    script: str,
    nodes: int,
    args: Sequence[str],
    tasks_per_node: int = 1,
    sbatch_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout: float = 400.0,
) -> SandboxJob:
    """``sbatch jobs/<script>`` on ``nodes`` nodes; outputs under ``root/name``."""
    job = SandboxJob(sandbox, root / name, nodes=nodes, timeout=timeout)
    job.submit(args, script=script, tasks_per_node=tasks_per_node, sbatch_args=sbatch_args, env=env)
    return job


def check_training(run: SandboxJob, *, loss_falls: bool = True) -> None:
    """Ranks formed one cluster, the loss fell, weights agree, only the chief wrote
    (its checkpoints, summaries, SavedModel, logs and the worker count of this start).

    ``loss_falls=False`` for runs too short to learn (a few steps of a ResNet, whose
    first steps at the full learning rate often raise the loss): the rest still holds.
    """
    assert run.finish() == "COMPLETED", run.report()
    ranks = list(range(run.tasks))
    assert sorted(run.rank_events) == ranks, run.report()

    clusters = run.of("cluster")
    workers = {tuple(clusters[r][0]["workers"]) for r in ranks}
    assert len(workers) == 1, f"ranks disagree on the worker list: {workers}\n{run.report()}"
    (worker_list,) = workers
    assert len(worker_list) == run.tasks
    if run.tasks > 1:  # a one-task step is a single local worker (resolver contract)
        hosts = {w.rsplit(":", 1)[0] for w in worker_list}
        assert hosts <= {f"node{i}" for i in range(1, run.sandbox.nodes + 1)}, worker_list
        assert len(hosts) == run.nodes, worker_list
    for r in ranks:
        (cluster,) = clusters[r]
        assert cluster["rank"] == r
        assert cluster["num_workers"] == run.tasks

    done = run.of("done")
    finals = [done[r][-1] for r in ranks]
    for r, final in zip(ranks, finals, strict=True):
        assert final["rank"] == r
        if loss_falls:
            assert final["first_loss"] > final["last_loss"], f"loss did not fall: {final}"
        assert final["preempted"] is False
    sums = [f["weights_checksum"] for f in finals]
    assert all(math.isclose(s, sums[0], rel_tol=1e-9, abs_tol=1e-9) for s in sums), (
        f"ranks ended with different weights: {sums}\n{run.report()}"
    )
    evals = run.of("eval")
    assert evals[0], "the chief printed no eval event"
    assert all(not evals[r] for r in ranks[1:]), "a non-chief rank printed eval events"

    # Only the chief writes: one checkpoint series, one summary writer, one SavedModel.
    ckpt = run.model_dir / "checkpoints"
    assert (ckpt / "checkpoint").is_file(), run.report()
    assert list(ckpt.glob("ckpt-*.index")), run.report()
    assert (run.model_dir / "export" / "saved_model.pb").is_file(), run.report()
    for summaries in ("train", "eval", AllocationWriter.SPLIT):
        files = list((run.model_dir / summaries).glob("events.out.tfevents.*"))
        assert len(files) <= 1, f"more than one writer in {summaries}: {files}"
    known = {"checkpoints", "export", "train", "eval", "logs", WORKERS_FILE}
    known |= {AllocationWriter.SPLIT, ALLOCATION_STATE}  # the chief's allocation board
    unexpected = [
        p.relative_to(run.model_dir)
        for p in run.model_dir.rglob("*")
        if p.is_file() and p.relative_to(run.model_dir).parts[0] not in known
    ]
    assert unexpected == [], f"files no chief writes: {unexpected}"
    job_log = next(run.run_dir.glob("*.out")).read_text()
    assert "srun exited 0" in job_log, job_log
    check_clean_end(run.sandbox, run.job_id, {r: run.log_dir.glob(f"rank{r}.*") for r in ranks})


def check_clean_end(
    sandbox: SlurmSandbox,
    job_id: str,
    rank_logs: Mapping[int, Iterable[Path]],
    *,
    last_rank: int = 0,
) -> None:
    """No error-level line in any rank's log; a multi-worker job ended within
    ``CLEAN_END_S`` of ``last_rank``'s last line (rank 0: the ranks left together,
    slurmtf.runtime.rank.teardown; a sidecar evaluator ends after them)."""
    files = {rank: list(paths) for rank, paths in rank_logs.items()}
    for rank, paths in files.items():
        for path in paths:
            errors = ERROR_LINE.findall(path.read_text(errors="replace"))
            assert not errors, f"rank {rank} logged errors in a successful job ({path}): {errors}"
    if len(files) == 1:
        return  # one worker: no peers to leave with, the interpreter's own exit (1-3 s)
    last_line = max(p.stat().st_mtime for p in files[last_rank])
    # Slurm's EndTime is in whole seconds, rounded down: + 1 s bounds the true end above.
    teardown = sandbox.end_time(job_id) + 1.0 - last_line
    print(f"MEASURED teardown_{job_id} {teardown:.1f}")
    assert teardown <= CLEAN_END_S, (
        f"job {job_id} ended {teardown:.1f} s after rank {last_rank}'s last line "
        f"(> {CLEAN_END_S} s)"
    )


def rank_pids(
    job_id: str, rank: int, module: str = "models.mnist", present: Sequence[str] = ()
) -> list[int]:
    """Python processes running ``module`` (``slurmtf_models.mnist`` under ``slurmtf
    submit``) in job ``job_id`` whose ``SLURM_PROCID`` is ``rank`` (and whose start
    environment has each variable of ``present``), but no warm rank that still waits for
    the next attempt (:func:`slurmtf.runtime.rank.standby.waits`)."""
    want = {b"SLURM_JOB_ID": job_id.encode(), b"SLURM_PROCID": str(rank).encode()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if not Path(argv[0].decode()).name.startswith("python") or module.encode() not in argv:
                continue
            items = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        environ = dict(item.split(b"=", 1) for item in items if b"=" in item)
        wanted = all(environ.get(key) == value for key, value in want.items())
        has = all(name.encode() in environ for name in present)
        if wanted and has and not waits(environ.get(b"SLURMTF_STANDBY")):
            found.append(int(entry.name))
    return found


def wait_until(job: SandboxJob, condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if job.state() in TERMINAL:
            break
        time.sleep(0.3)
    job.cancel()
    pytest.fail(f"{what} did not happen within {timeout:.0f} s\n{job.report()}")


def wait_terminal(job: SandboxJob, since: float, timeout: float) -> tuple[str, float]:
    """Final state and seconds from ``since`` until Slurm reported it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = job.state()
        if state in TERMINAL:
            return state, time.monotonic() - since
        time.sleep(0.3)
    job.cancel()
    pytest.fail(f"job {job.job_id} still running {timeout:.0f} s after the fault\n{job.report()}")


def new_job(jobs: list[SandboxJob], sandbox: SlurmSandbox, root: Path, name: str) -> SandboxJob:
    job = SandboxJob(sandbox, root / name)
    jobs.append(job)
    return job


def check_status(
    sandbox: SlurmSandbox, job_id: str, state_home: Path, steps: int, redone: int | None = None
) -> None:
    """``slurmtf status`` and ``logs`` find a job restarted once by its id alone, from
    another folder (its record in ``state_home``), and say what happened as a person
    reads it: with ``redone``, what the failure cost in steps (and seconds, goodput)."""
    cli = [PYTHON, "-m", "slurmtf.cli"]
    env = {"XDG_STATE_HOME": str(state_home), "PYTHONPATH": str(REPO)}
    status = sandbox.run([*cli, "status", job_id], cwd=state_home, env=env).stdout
    assert "restarts 1" in status, status
    assert f"step {steps}/{steps}" in status, status
    if redone is not None:
        steps_word = "step" if redone == 1 else "steps"
        cost = rf"1 failure: \d+\.\d s lost, {redone} {steps_word} redone, goodput (0\.\d\d|1\.00)"
        found = re.search(cost, status)
        assert found, status
        print(f"MEASURED slurmtf status: {found.group(0)}")
    logs = sandbox.run([*cli, "logs", job_id, "--rank=1"], cwd=state_home, env=env).stdout
    assert "rank 1: done at step" in logs, logs
    assert '"event"' not in logs, logs


def batch_side(log_dir: Path, job_id: str) -> Beat:
    """The supervisor's heartbeat (slurmtf.runtime.batch_host.heartbeat): its batch host and PID."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        beat = read_beat(beat_path(log_dir, job_id))
        if beat is not None and beat.state == "running":
            return beat
        time.sleep(0.2)
    raise AssertionError(f"no heartbeat of job {job_id} in {log_dir}")


def trained_in_start(out: Path, start: int) -> bool:
    """Rank 0's ``start``-th ``cluster`` event (1-based) has a training step after it."""
    starts = 0
    for event in read_events(out) if out.exists() else []:
        starts += event.get("event") == "cluster"
        if starts >= start and event.get("event") == "progress":
            return True
    return False


def job_processes(job_id: str, spared: Iterable[int] = ()) -> list[str]:
    """Every process of job ``job_id`` on this machine but ``spared`` (a frozen node's, which
    only its node's return ends): those with its SLURM_JOB_ID, its slurmstepds, and what
    ``pgrep -f`` finds of its watcher and its keeper and supervisor."""
    found = []
    skip = {*spared, os.getpid()}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        mine = f"SLURM_JOB_ID={job_id}".encode() in environ
        if mine or argv.startswith(f"slurmstepd: [{job_id}."):
            found.append(f"{entry.name} {argv}")
    pattern = f"slurmtf.cli watcher --job_id={job_id} "
    done = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True, check=False)
    found += [line for line in done.stdout.splitlines()
              if int(line.split()[0]) not in skip and "pgrep" not in line]  # fmt: skip
    return sorted(set(found))


def no_process_left(job_id: str, spared: Iterable[int] = (), timeout: float = 30) -> list[str]:
    """:func:`job_processes` once the job's processes had ``timeout`` s to go."""
    deadline = time.monotonic() + timeout
    while job_processes(job_id, spared) and time.monotonic() < deadline:
        time.sleep(0.5)
    return job_processes(job_id, spared)


def record_lines(sandbox: SlurmSandbox, job_id: str, state_home: Path) -> tuple[str, str, str]:
    """``slurmtf status JOB`` as Slurm answers, ``slurmtf status JOB`` without Slurm's
    configuration (the controller cannot be reached), ``slurmtf logs JOB``; from another
    folder, the job found by its id in the user's record (``state_home``)."""
    cli = [PYTHON, "-m", "slurmtf.cli"]
    env = {"XDG_STATE_HOME": str(state_home), "PYTHONPATH": str(REPO)}
    status = sandbox.run([*cli, "status", job_id], cwd=state_home, env=env).stdout
    silent = {k: v for k, v in sandbox.env.items() if k != "SLURM_CONF"}
    alone = subprocess.run([*cli, "status", job_id], cwd=state_home, env={**silent, **env},
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    logs = sandbox.run([*cli, "logs", job_id], cwd=state_home, env=env)
    return status, alone.stdout + alone.stderr, logs.stdout + logs.stderr


def event_step(out: Path) -> int:
    """The step of rank 0's last ``progress`` event (0 before the first)."""
    found = [e for e in (read_events(out) if out.exists() else []) if e.get("event") == "progress"]
    step = found[-1].get("step") if found else 0
    return step if isinstance(step, int) else 0
