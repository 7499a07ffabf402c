"""One watchdog thread per rank: fail the run when training stops making progress.

TensorFlow's per-collective timeout (``CommunicationOptions(timeout_seconds=T)``) parks a
sleeping thread for ``T`` seconds per collective op, so a long run with frequent
collectives runs out of threads. This watchdog costs one thread and one small file per
rank, whatever the length of the run:

* the training loop calls :meth:`ProgressWatchdog.enter` when it starts a phase (a train
  step, an evaluation batch, a checkpoint save) and :meth:`ProgressWatchdog.finished`
  when a step or batch is done: two attribute writes, no lock, no syscall;
* the thread rewrites ``<dir>/rank<N>.progress.json`` (step, phase, since when) every few
  seconds, so the ranks can see each other's progress on the shared log folder;
* when nothing finished for longer than the limit it reads every rank's record, names
  the ranks that look stuck (silent record: frozen or dead; outside any collective for a
  long time: stuck in its own code; behind the others), dumps this process's Python
  stacks to stderr (this rank's log) and ends the process with exit status 1.

The limit is ``max(floor, factor x slowest recent step)``; until the first step has
finished (tracing, compiling, peers starting) ``first_step_grace`` is added. Dead and
frozen peers are usually reported sooner by TensorFlow itself (closed connections,
coordination-service heartbeats); this covers a peer that is alive but never arrives.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import faulthandler
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from slurmtf import events

# Phases a rank can be in. Only "step" and "eval" wait in collectives with the others.
IN_COLLECTIVE = ("step", "eval")
EXIT_STALLED = 1
RECENT_STEPS = 64  # step durations kept to derive the limit (bounded memory)


@dataclasses.dataclass(frozen=True)
class WatchPolicy:
    """How long a rank may go without finishing a step before the run fails."""

    floor: float = 120.0  # seconds; never less than this
    factor: float = 20.0  # times the slowest recent step
    first_step_grace: float = 300.0  # added until the first step has finished
    interval: float = 5.0  # seconds between progress records

    def limit(self, recent_steps: Sequence[float], started: bool) -> float:
        """Seconds without a finished step after which the run is declared stalled."""
        slowest = max(recent_steps, default=0.0)
        limit = max(self.floor, self.factor * slowest)
        return limit if started else limit + self.first_step_grace


@dataclasses.dataclass(frozen=True)
class Record:
    """What one rank last said about itself (``rank<N>.progress.json``)."""

    rank: int
    step: int
    phase: str
    phase_since: float  # wall clock, seconds since the epoch
    updated: float  # wall clock of the write
    host: str = ""
    pid: int = 0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Record:
        data = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def suspects(
    records: Mapping[int, Record | None],
    now: float,
    *,
    limit: float,
    interval: float,
    workers: Sequence[str] = (),
) -> list[str]:
    """Why each rank looks stuck, one phrase per suspected rank (pure).

    ``records`` maps every rank to its last record (``None``: none was found). A rank is
    suspected when its record is silent for longer than a few intervals (frozen, dead,
    unreachable), when it has been outside the collectives for most of ``limit`` (stuck
    in its own code: input pipeline, file system), or when it is behind the others.
    """
    silent_after = max(3 * interval, 15.0)
    known = [r for r in records.values() if r is not None]
    newest_step = max((r.step for r in known), default=0)
    found = []
    for rank in sorted(records):
        record = records[rank]
        who = f"rank {rank}" + (f" ({workers[rank]})" if rank < len(workers) else "")
        if record is None:
            found.append(f"{who}: no progress record")
        elif now - record.updated > silent_after:
            found.append(
                f"{who}: silent for {now - record.updated:.0f} s at step {record.step} "
                "(frozen, killed or unreachable)"
            )
        elif record.phase not in IN_COLLECTIVE and now - record.phase_since > limit / 2:
            found.append(
                f"{who}: in {record.phase!r} for {now - record.phase_since:.0f} s at step "
                f"{record.step}, outside any collective (stuck in its own code)"
            )
        elif record.step < newest_step:
            found.append(f"{who}: behind, at step {record.step} of {newest_step}")
    return found


def record_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.progress.json"


def read_records(directory: str | Path | None, num_workers: int) -> dict[int, Record | None]:
    """Every rank's last record from ``directory`` (``None`` where missing or unreadable)."""
    records: dict[int, Record | None] = {}
    for rank in range(num_workers):
        try:
            text = record_path(directory, rank).read_text() if directory else ""
            records[rank] = Record.from_json(text) if text else None
        except (OSError, ValueError, TypeError):
            records[rank] = None
    return records


def write_record(directory: str | Path, record: Record) -> None:
    """Replace this rank's record atomically (a reader never sees half a file)."""
    path = record_path(directory, record.rank)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(record.to_json())
    tmp.replace(path)


class ProgressWatchdog:
    """The loop reports progress; one daemon thread fails the run when it stops."""

    def __init__(
        self,
        *,
        rank: int,
        workers: Sequence[str],
        directory: str | None,
        policy: WatchPolicy,
        program: str = "slurmtf",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_stall: Callable[[str], None] | None = None,
    ) -> None:
        self.rank = rank
        self.workers = tuple(workers)
        self.directory = directory
        self.policy = policy
        self.program = program
        self._clock, self._wall = clock, wall
        self._on_stall = on_stall or _fail_process
        self._recent: collections.deque[float] = collections.deque(maxlen=RECENT_STEPS)
        self._step = 0
        self._phase = "start"
        self._phase_since_wall = wall()
        self._last_progress = clock()
        self._started = False
        self._paused = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_words: Callable[[str], None] | None = None

    # ------------------------------------------------------------ called by the loop
    def enter(self, phase: str, step: int) -> None:
        """This rank starts ``phase`` (``step``, ``eval``, ``save``, ``host``...) at ``step``."""
        self._step, self._phase, self._phase_since_wall = step, phase, self._wall()

    def finished(self, step: int, *, is_train_step: bool = True) -> None:
        """A step (or eval batch) finished: progress, and a sample of the step time."""
        now = self._clock()
        if is_train_step and self._started:
            self._recent.append(now - self._last_progress)
        self._started = self._started or is_train_step
        self._last_progress = now
        self.enter("host", step)

    def at_stall(self, action: Callable[[str], None]) -> None:
        """Run ``action("stalled")`` before the stall ends the process (the main thread
        waits in a collective, so the variables hold the last completed step)."""
        self._last_words = action

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Local work that may take long and holds no peer (e.g. the final export)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1
            self._last_progress = self._clock()

    @property
    def limit(self) -> float:
        return self.policy.limit(self._recent, self._started)

    # ------------------------------------------------------------ the thread
    def start(self) -> ProgressWatchdog:
        self._last_progress = self._clock()
        if self.directory:
            Path(self.directory).mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._watch, name="slurmtf-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.policy.interval + 5)
            self._thread = None

    def check(self) -> str | None:
        """The stall message when the limit has passed, else ``None`` (one watch tick)."""
        if self._paused:
            return None
        idle = self._clock() - self._last_progress
        limit = self.limit
        if idle <= limit:
            return None
        records = read_records(self.directory, len(self.workers) or 1)
        records[self.rank] = self._record()  # our own view is the freshest
        named = suspects(
            records,
            self._wall(),
            limit=limit,
            interval=self.policy.interval,
            workers=self.workers,
        )
        if not self.directory:
            named.append("no shared log folder to compare ranks (pass --log_dir or --model_dir)")
        return (
            f"{self.program}: no training step finished for {idle:.0f} s on rank {self.rank} "
            f"(limit {limit:.0f} s = max(--stall_timeout={self.policy.floor:g}, "
            f"--stall_factor={self.policy.factor:g} x slowest recent step)); suspected: "
            f"{'; '.join(named) or 'none identified'}. HINT: read the suspected ranks' logs "
            "(each stalled rank dumps its Python stacks there); rerun (or requeue) to resume "
            "from the last checkpoint; raise --stall_timeout if steps are legitimately slow"
        )

    def _record(self) -> Record:
        return Record(
            rank=self.rank,
            step=self._step,
            phase=self._phase,
            phase_since=self._phase_since_wall,
            updated=self._wall(),
            host=socket.gethostname(),
            pid=os.getpid(),
        )

    def _watch(self) -> None:
        while not self._stop.wait(self.policy.interval):
            if self.directory:
                with contextlib.suppress(OSError):
                    write_record(self.directory, self._record())
            message = self.check()
            if message is not None:
                if self._last_words is not None:
                    self._last_words("stalled")
                self._on_stall(message)
                return


def _fail_process(message: str) -> None:
    """Report a stall and end the process: the main thread is blocked in TensorFlow."""
    events.emit("stalled", message=message)
    print(message, file=sys.stderr, flush=True)
    with contextlib.suppress(Exception):
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os._exit(EXIT_STALLED)


def from_config(
    config: Any, rank: int, workers: Sequence[str], log_dir: str | None, program: str
) -> ProgressWatchdog | None:
    """The watchdog ``config`` asks for (``None`` when ``--stall_timeout=0``)."""
    if not config.stall_timeout:
        return None
    policy = WatchPolicy(
        floor=config.stall_timeout,
        factor=config.stall_factor,
        first_step_grace=config.registration_timeout or WatchPolicy.first_step_grace,
        interval=min(WatchPolicy.interval, max(config.stall_timeout / 4, 0.5)),
    )
    return ProgressWatchdog(
        rank=rank, workers=workers, directory=log_dir, policy=policy, program=program
    )
