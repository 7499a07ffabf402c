"""Shared pieces of the benchmarks, the one module through which they share helpers (a
benchmark imports no other; ``protocol`` is their shape): the pure math, table rendering,
the chief's progress (rates, the last and the resumed step), the RING strategy of the
all-reduce workers, machine facts, a launcher for local worker processes that look like
Slurm tasks to the resolver, and a sandbox job's processes, their resources and state.

The pure functions (``efficiency``, ``bus_bandwidth``, ``markdown_table``, ``fake_slurm_env``,
``steady_rate``) are unit-tested; everything that starts processes is not timed by tests.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from slurmtf.events import named, parse_events, read_events
from slurmtf.local.step import LocalStep, scrubbed_env, start_rank
from slurmtf.runtime.rank.standby import waits

REPO = Path(__file__).resolve().parent.parent
JSONDict = dict[str, Any]
MB = 1 << 20


# ---------------------------------------------------------------------------- math
def efficiency(rates: Mapping[int, float]) -> dict[int, float]:
    """Scaling efficiency rate(N) / (N * rate(1)) for every measured worker count N.

    ``rates`` maps a worker count to its total throughput (examples/s, all workers
    together). The one-worker rate is the baseline and must be present and positive.
    """
    base = rates.get(1)
    if base is None or base <= 0:
        raise ValueError(f"rates={dict(rates)!r}: need a positive rate for 1 worker")
    out: dict[int, float] = {}
    for n, rate in sorted(rates.items()):
        if n < 1:
            raise ValueError(f"worker count {n!r} must be at least 1")
        out[n] = rate / (n * base)
    return out


def ring_factor(n: int) -> float:
    """Bytes each rank sends per byte of buffer in a ring all-reduce: 2(n-1)/n."""
    if n < 1:
        raise ValueError(f"n={n!r}: need at least one rank")
    return 2.0 * (n - 1) / n


def bus_bandwidth(nbytes: float, seconds: float, n: int) -> float:
    """Bus bandwidth (bytes/s) of an all-reduce, as nccl-tests defines it.

    algbw = nbytes / seconds; busbw = algbw * 2(n-1)/n, which is the per-rank link
    bandwidth a ring all-reduce needs, so it compares directly with a link's speed.
    For n = 2 the two are equal.
    """
    if seconds <= 0:
        raise ValueError(f"seconds={seconds!r} must be positive")
    return nbytes / seconds * ring_factor(n)


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no values")
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


# ---------------------------------------------------------------------------- tables
def fmt(value: Any, digits: int = 3) -> str:
    """A table cell: floats to ``digits`` significant figures, None as an em dash."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 10**digits:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return str(value)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub Markdown table; numbers right-aligned, text left-aligned."""
    body = [[fmt(cell) for cell in row] for row in rows]
    for row in body:
        if len(row) != len(headers):
            raise ValueError(f"row {row!r} has {len(row)} cells, headers have {len(headers)}")
    numeric = [
        all(_looks_numeric(row[i]) for row in body) and bool(body) for i in range(len(headers))
    ]
    lines = ["| " + " | ".join(headers) + " |"]
    lines.append("| " + " | ".join("---:" if num else "---" for num in numeric) + " |")
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines) + "\n"


def _looks_numeric(cell: str) -> bool:
    text = cell.replace(",", "").replace("—", "").strip()
    if not text:
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------- progress
def progress_events(stdout: str) -> list[JSONDict]:
    """The chief's ``progress`` events (step, total, loss, accuracy, examples_per_sec)."""
    return named(parse_events(stdout), "progress")


def checkpoint_events(stdout: str) -> list[JSONDict]:
    """The chief's ``checkpoint`` events (step, seconds training stood still, asynchronous)."""
    return named(parse_events(stdout), "checkpoint")


def steady_rate(stdout: str, global_batch: int) -> tuple[float, int]:
    """Examples/s over every progress interval after the first; (rate, steps timed).

    Each ``progress`` event (the chief's stdout) reports the rate of the interval since
    the previous one; the overall rate is total examples over total time, so intervals
    are weighted by time.
    """
    points = [(int(e["step"]), float(e["examples_per_sec"])) for e in progress_events(stdout)]
    if len(points) < 2:
        raise ValueError(f"need at least 2 progress events to skip the first, got {len(points)}")
    examples = seconds = 0.0
    steps = 0
    for (prev, _), (step, rate) in itertools.pairwise(points):
        n = step - prev
        if n <= 0 or rate <= 0:
            continue
        examples += n * global_batch
        seconds += n * global_batch / rate
        steps += n
    if seconds <= 0:
        raise ValueError("no timed interval in the progress events")
    return examples / seconds, steps


def last_step(out: Path) -> int:
    """The last step rank 0 logged in ``out`` (its stdout: ``progress`` events); 0 for none."""
    steps = [e["step"] for e in read_events(out) if e.get("event") == "progress"]
    return max(steps, default=0)


def resumed_step(out: Path) -> int | None:
    """The first step rank 0 logged in ``out`` after its second ``cluster`` event (a
    restart or requeue), if any yet."""
    clusters = 0
    for event in read_events(out):
        clusters += event.get("event") == "cluster"
        if clusters >= 2 and event.get("event") == "progress":
            return int(event["step"])
    return None


# ---------------------------------------------------------------------------- all-reduce
def ring_strategy() -> tuple[Any, JSONDict]:
    """MultiWorkerMirroredStrategy (RING) through the slurmtf resolver, and this rank's
    ``rank`` and ``workers`` for its JSON line (imports TensorFlow: call it in a worker)."""
    import tensorflow as tf

    from slurmtf.resolver import cluster_resolver, resolve

    layout = resolve()
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
        timeout_seconds=300.0,
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=cluster_resolver(layout), communication_options=options
    )
    info = {"rank": layout.task_index, "workers": list(layout.workers)}
    return strategy, info


# ---------------------------------------------------------------------------- machine
def _run_text(cmd: Sequence[str]) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout or done.stderr).strip()
    return text if done.returncode == 0 and text else None


def package_version(*names: str) -> str | None:
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(name)
    return None


def exact_once_flags() -> list[str]:
    """Model flags that let a resumed run end with an undisturbed run's weights on this
    interpreter's Keras: Keras 2 (TensorFlow 2.15) draws dropout masks from stateful ops
    no checkpoint holds, so there the runs train without dropout (docs/FAILURES.md)."""
    major = (package_version("keras") or "3").split(".")[0]
    return ["--dropout_rate=0"] if major.isdigit() and int(major) < 3 else []


def machine_info() -> JSONDict:
    """Facts that make a number reproducible: date, CPU, cores, load, versions."""
    cpu_model = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        first = Path("/proc/meminfo").read_text().splitlines()[0]
        mem_gib = round(int(first.split()[1]) / 2**20, 1)
    slurm = _run_text(["srun", "--version"]) or _run_text(
        ["dpkg-query", "-W", "-f=slurm-client ${Version}", "slurm-client"]
    )
    return {
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "os": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": package_version("tensorflow-cpu", "tensorflow"),
        "keras": package_version("keras"),
        "numpy": package_version("numpy"),
        "slurm": slurm,
    }


def cores() -> list[int]:
    """The CPU ids this process may run on, in order."""
    return sorted(os.sched_getaffinity(0))


# ---------------------------------------------------------------------------- workers
def fake_slurm_env(rank: int, num_tasks: int, job_id: int, port_base: int) -> dict[str, str]:
    """Rank ``rank`` of a one-node step of ``num_tasks`` tasks on ``localhost``."""
    return LocalStep(tasks_per_node=num_tasks, job_id=job_id, port_base=port_base).rank_env(rank)


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without Slurm/TF_CONFIG variables, plus ``extra``."""
    env = scrubbed_env()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class WorkerRun:
    rank: int
    returncode: int
    finished: bool  # the done marker was printed (the work itself completed)
    stdout: str
    stderr: str
    seconds: float

    @property
    def stderr_tail(self) -> str:
        return self.stderr[-3000:]


def run_workers(
    argvs: Sequence[Sequence[str]],
    envs: Sequence[Mapping[str, str]],
    cpu_sets: Sequence[Sequence[int] | None],
    *,
    timeout: float,
    log_dir: Path | None = None,
    done_marker: str | None = None,
    exit_grace: float = 10.0,
) -> list[WorkerRun]:
    """Start one process per rank (each pinned to its CPUs), wait for all, return outputs.

    On timeout every process started here is killed (by its own process group) and the
    runs report return code -9. Nothing else is touched. With ``done_marker``, ranks whose
    stdout already holds it (their work is done) but that have not exited ``exit_grace``
    seconds after the last rank printed it are killed the same way and count as
    finished: a slow shutdown is not part of what is measured.
    """
    procs: list[subprocess.Popen[bytes]] = []
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        folder = log_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        folder.mkdir(parents=True, exist_ok=True)
        outs = [folder / f"rank{rank}.out" for rank in range(len(argvs))]
        errs = [folder / f"rank{rank}.err" for rank in range(len(argvs))]
        try:
            for rank, (argv, env, cpus) in enumerate(zip(argvs, envs, cpu_sets, strict=True)):
                procs.append(
                    start_rank(argv, env, outs[rank], errs[rank], cwd=REPO, preexec_fn=pin_to(cpus))
                )
            _wait_all(procs, outs, start + timeout, done_marker, exit_grace)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        seconds = time.perf_counter() - start
        runs = []
        for rank, proc in enumerate(procs):
            stdout = outs[rank].read_text(errors="replace")
            runs.append(
                WorkerRun(
                    rank=rank,
                    returncode=proc.returncode,
                    finished=done_marker in stdout if done_marker else False,
                    stdout=stdout,
                    stderr=errs[rank].read_text(errors="replace"),
                    seconds=seconds,
                )
            )
    return runs


def _wait_all(
    procs: Sequence[subprocess.Popen[bytes]],
    outs: Sequence[Path],
    deadline: float,
    marker: str | None,
    grace: float,
) -> None:
    """Wait until all exit, the deadline passes, or all printed ``marker`` + ``grace`` s."""
    all_done_at: float | None = None
    needle = marker.encode() if marker else None
    while time.perf_counter() < deadline:
        if all(proc.poll() is not None for proc in procs):
            return
        if (
            needle is not None
            and all_done_at is None
            and all(_file_has(out, needle) for out in outs)
        ):
            all_done_at = time.perf_counter()
        if all_done_at is not None and time.perf_counter() - all_done_at > grace:
            return
        time.sleep(0.2)


def _file_has(path: Path, needle: bytes) -> bool:
    try:
        return needle in path.read_bytes()
    except OSError:
        return False


def pin_to(cpus: Sequence[int] | None) -> Any:
    """A ``preexec_fn`` that pins the child to ``cpus`` (``None``: no pinning, no function)."""
    if cpus is None:
        return None
    chosen = set(cpus)

    def pin() -> None:
        os.sched_setaffinity(0, chosen)

    return pin


def check_runs(runs: Sequence[WorkerRun], what: str) -> None:
    """Raise with the failing rank's stderr if any worker did not exit 0."""
    for run in runs:
        if run.returncode != 0 and not run.finished:
            raise RuntimeError(
                f"{what}: rank {run.rank} exited {run.returncode}\n{run.stderr_tail}"
            )


def python() -> str:
    return sys.executable


# ---------------------------------------------------------------------------- sandbox jobs
# How a rank's own Python is told from srun's (whose command line names the same words).
RANK_MARKERS = (b"models.", b"slurmtf.run")


@dataclass(frozen=True)
class Usage:
    """One process's resources at one moment."""

    threads: int
    rss_kb: int
    fds: int
    # VmRSS = RssAnon (the process's own memory: heap, stacks, tensors) + RssFile (pages of
    # mapped files: TensorFlow's shared libraries, which the kernel may drop when they are
    # cold and read back on use) + RssShmem.
    anon_kb: int = 0
    file_kb: int = 0


def read_usage(pid: int, proc: Path = Path("/proc")) -> Usage | None:
    """Threads, VmRSS and its parts (kB) and open fds of ``pid``; ``None`` once it is
    gone."""
    base = proc / str(pid)
    try:
        threads = sum(1 for _ in (base / "task").iterdir())
        fds = sum(1 for _ in (base / "fd").iterdir())
        status = (base / "status").read_text()
    except OSError:
        return None
    kb = {
        line.split(":")[0]: int(line.split()[1])
        for line in status.splitlines()
        if line.startswith(("VmRSS:", "RssAnon:", "RssFile:"))
    }
    return Usage(threads=threads, rss_kb=kb.get("VmRSS", 0), fds=fds,
                 anon_kb=kb.get("RssAnon", 0), file_kb=kb.get("RssFile", 0))  # fmt: skip


def proc_figures(pid: int, proc: Path = Path("/proc")) -> dict[str, int] | None:
    """Threads, open fds and RSS (kB) of ``pid`` (:func:`read_usage`) as a sample's
    figures; ``None`` once it is gone."""
    usage = read_usage(pid, proc)
    return None if usage is None else {"threads": usage.threads, "fds": usage.fds,
                                       "rss_kb": usage.rss_kb}  # fmt: skip


def cpu_seconds(pid: int, proc: Path = Path("/proc")) -> float | None:
    """Seconds ``pid`` ran on a CPU so far, user and system, to the nanosecond: the sum
    over its live threads of ``/proc/PID/task/TID/schedstat`` (its first field); ``None``
    once it is gone.

    Its own threads only, never its children (the supervisor's srun, a step's ranks), and
    not threads that already ended: right for the processes the benchmarks follow, whose
    threads live as long as they do (the supervisor and its heartbeat thread, the keeper,
    the watcher); a slurmstepd's short-lived message threads are left out. Finer than
    ``utime + stime`` of ``/proc/PID/stat``, counted in clock ticks (10 ms): a process that
    reads a small file every few seconds uses less than one tick a minute."""
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
        return sum(int((t / "schedstat").read_text().split()[0]) for t in tasks) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def processes(proc: Path = Path("/proc")) -> Iterator[tuple[int, list[bytes], list[bytes]]]:
    """Every readable process on this machine: its PID, command line and environment
    (``\0``-separated items); one that ends while being read is skipped."""
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        yield int(entry.name), cmdline, environ


def environ_of(pid: int, proc: Path = Path("/proc")) -> dict[bytes, bytes]:
    """The environment ``pid`` started with ({} once it is gone)."""
    try:
        items = (proc / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(item.split(b"=", 1) for item in items if b"=" in item)


def process_kind(job_id: str, argv: Sequence[bytes], environ: Iterable[bytes]) -> str:
    """What a process is to job ``job_id`` ("" when it is not the job's): ``stepd`` (a
    slurmstepd titled ``[JOB.STEP]``), ``batch`` (the job's supervisor, which the batch
    script became, by its command line or its title), ``rank<R>`` (a rank's own Python),
    ``warm<R>`` (a warm rank that waits) or ``other`` (srun, probes...)."""
    if argv and argv[0].startswith(f"slurmstepd: [{job_id}.".encode()):
        return "stepd"
    env = dict(item.split(b"=", 1) for item in environ if b"=" in item)
    if env.get(b"SLURM_JOB_ID") != job_id.encode():
        return ""
    python = bool(argv) and Path(argv[0].decode(errors="replace")).name.startswith("python")
    if python and any(a.startswith(RANK_MARKERS) for a in argv) and b"SLURM_PROCID" in env:
        rank = env[b"SLURM_PROCID"].decode()
        return f"warm{rank}" if waits(env.get(b"SLURMTF_STANDBY")) else f"rank{rank}"
    if python and argv[1:4] == [b"-m", b"slurmtf", b"job"]:
        return "batch"
    if argv and argv[0].startswith(b"slurmtf job "):  # titled: "slurmtf job KIND (keeper)"
        return "batch"
    return "other"


def job_processes(job_id: str, proc: Path = Path("/proc")) -> dict[str, list[int]]:
    """This job's processes on this machine by :func:`process_kind`; of two ``batch``
    processes, the one whose parent is not the other is the ``keeper`` (the process the
    batch script became, whose child the supervisor is)."""
    found: dict[str, list[int]] = {}
    for pid, argv, environ in processes(proc):
        kind = process_kind(job_id, argv, environ)
        if kind:
            found.setdefault(kind, []).append(pid)
    both = found.get("batch", [])
    keepers = [pid for pid in both if len(both) > 1 and parent(pid, proc) not in both]
    if keepers:
        found["keeper"] = keepers
        found["batch"] = [pid for pid in both if pid not in keepers]
    return found


def parent(pid: int, proc: Path = Path("/proc")) -> int:
    """``pid``'s parent (``/proc/PID/stat``); 0 when it cannot be read."""
    try:
        return int((proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def rank_pids(job_id: str, proc: Path = Path("/proc")) -> dict[int, int]:
    """``{rank: pid}`` of the Python rank processes of job ``job_id`` on this machine."""
    found = job_processes(job_id, proc)
    ranks = (k for k in found if k.startswith("rank"))
    return {int(k.removeprefix("rank")): found[k][0] for k in ranks}


def submit_job(sandbox: Any, args: Sequence[str], env: Mapping[str, str] | None = None, *,
               base: Mapping[str, str] | None = None, cwd: Path = REPO) -> str:  # fmt: skip
    """``sbatch --parsable ARGS`` (its options, then a job script and its arguments, or
    ``--wrap``) on ``sandbox`` from ``cwd`` (the submit directory: this checkout), with
    ``env`` added to ``base`` (this process's environment); the job's id."""
    full = sandbox.env({**(os.environ if base is None else base), **(env or {})})
    done = subprocess.run(["sbatch", "--parsable", *args], env=full, cwd=cwd,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"sbatch {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip().split(";")[0]


def job_states(sandbox: Any, job_id: str) -> list[str]:
    """What squeue says of the job now (``RUNNING``, ``COMPLETED``...), one state per task
    of a job array; [] when it forgot the job."""
    done = sandbox.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], check=False)
    return [str(state) for state in done.stdout.split()]


def job_state(sandbox: Any, job_id: str) -> str:
    """The job's state now ("" when squeue forgot it)."""
    return next(iter(job_states(sandbox, job_id)), "")


def queued(sandbox: Any, job_id: str) -> bool:
    """The job (every task of an array) has not ended yet: pending, starting, running or
    ending."""
    active = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING")
    return any(state in active for state in job_states(sandbox, job_id))


def attempt_started(out: Path, attempt: int) -> bool:
    """Rank 0 of ``attempt`` (0-based) said it trains: its (attempt+1)-th ``cluster``
    event in ``out`` is followed by a ``progress`` event."""
    clusters = 0
    for event in read_events(out):
        clusters += event.get("event") == "cluster"
        if clusters == attempt + 1 and event.get("event") == "progress":
            return True
    return False


def wait_until(what: str, test: Callable[[], object], timeout: float, every: float = 0.5) -> None:
    """Poll ``test`` until it is true; TimeoutError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if test():
            return
        time.sleep(every)
    raise TimeoutError(f"no {what} within {timeout:.0f} s")


# Allowed growth after warm-up (last fifth against first fifth of the samples).
MAX_THREAD_GROWTH = 8
MAX_FD_GROWTH = 8
MAX_RSS_GROWTH = 0.05


def trend(
    times: Sequence[float], values: Sequence[float], warmup: float, until: float = math.inf
) -> JSONDict:
    """Start, end, growth and least-squares slope per hour of ``values`` after ``warmup``
    (and before ``until``).

    Growth compares the mean of the last fifth of the samples with the mean of the first
    fifth (after warm-up), so one noisy sample neither hides nor fakes a trend.
    """
    points = [(t, v) for t, v in zip(times, values, strict=True) if warmup <= t < until]
    if len(points) < 5:
        raise ValueError(f"need at least 5 samples after the warm-up, got {len(points)}")
    fifth = max(1, len(points) // 5)
    first = sum(v for _, v in points[:fifth]) / fifth
    last = sum(v for _, v in points[-fifth:]) / fifth
    return {
        "start": first,
        "end": last,
        "growth": last - first,
        "growth_fraction": (last - first) / first if first else 0.0,
        "slope_per_hour": slope_per_hour(points),
        # the second half alone: growth that goes on, not start-up settling
        "last_half_slope_per_hour": slope_per_hour(points[len(points) // 2 :]),
        "min": min(v for _, v in points),
        "max": max(v for _, v in points),
    }


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of ``(seconds, value)`` points, per hour (0 for fewer than 2)."""
    if len(points) < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / len(points)
    mean_v = sum(v for _, v in points) / len(points)
    var_t = sum((t - mean_t) ** 2 for t, _ in points)
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var_t * 3600 if var_t else 0.0


def growth_problems(what: str, trends: JSONDict) -> list[str]:
    """What grew beyond the limits above in ``trends`` (:func:`trend` of ``threads``,
    ``fds`` and ``rss_kb``), each problem named by ``what``."""
    problems = []
    if trends["threads"]["growth"] > MAX_THREAD_GROWTH:
        problems.append(f"{what}: threads grew by {trends['threads']['growth']:.0f}")
    if trends["fds"]["growth"] > MAX_FD_GROWTH:
        problems.append(f"{what}: open fds grew by {trends['fds']['growth']:.0f}")
    if trends["rss_kb"]["growth_fraction"] > MAX_RSS_GROWTH:
        problems.append(f"{what}: RSS grew by {100 * trends['rss_kb']['growth_fraction']:.1f} %")
    return problems
