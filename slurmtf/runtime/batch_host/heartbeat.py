"""The supervisor's heartbeat: one small file in the job's log folder, rewritten every
few seconds, that the job's watcher reads from another node.

``LOG_DIR/supervisor-<job>.json`` holds one JSON object (:class:`Beat`): the job, the
batch host, the supervisor's and its keeper's PIDs, a counter that changes on every
write, the time, the supervisor's state and its attempt. It never grows. It is
rewritten in place (truncate, one write): on a shared file system a reader that opens
the file sees the writer's last close (NFS close-to-open), which a rename does not
promise while the reader's directory cache holds the old entry. A reader that catches a
half-written file reads nothing new (:func:`read_beat` returns ``None``), never a
stale beat.

The states: ``running``; ``restarting`` (the keeper starts the supervisor again);
``requeueing`` (the supervisor or the watcher asked Slurm to requeue the job);
``stopping`` (SIGTERM reached the supervisor: the job is cancelled, at its time limit
or requeued by Slurm); ``ended`` (the supervisor returned the job's status). The
watcher stands down at the last three (:data:`QUIET`).

The writer (:class:`Heartbeat`) is one daemon thread of the supervisor. Before each
write it sends one byte to the keeper's pipe, so that the keeper on the same host
learns that the supervisor lives without reading the file. SIGSTOP or a hang stops
every thread of the process, and the beats with them. Once it has written, a write it
finds there that is not its own means that the job has moved on without it (the watcher
requeued the job while this supervisor was stopped, and the job may run again
elsewhere): :attr:`Heartbeat.usurped`, and it writes no more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from slurmtf.runtime.job_log import stamp

BEAT_NAME = "supervisor-{job}.json"
STATES = ("running", "restarting", "requeueing", "stopping", "ended")
QUIET = ("requeueing", "stopping", "ended")  # the job ends or goes back to the queue
PULSE = b"."  # one beat on the keeper's pipe
# How long a silence means what, in beats (SLURMTF_HEARTBEAT_S, 5 s by default):
SILENT_BEATS = 3  # the watcher probes the batch host (a lost host: requeue at once)
STUCK_BEATS = 6  # the keeper ends its supervisor and starts it again
GIVE_UP_BEATS = 12  # the watcher requeues though the host answers (the keeper is gone too)


@dataclasses.dataclass(frozen=True)
class Beat:
    """One write of the heartbeat file."""

    job_id: str
    host: str  # the batch host (SLURMD_NODENAME), "" outside Slurm
    pid: int  # the supervisor
    keeper: int  # the batch script's own process, which restarts the supervisor
    count: int  # changes on every write: what the watcher looks at
    time: float  # when written (the writer's clock; the watcher keeps its own)
    state: str = "running"
    attempt: int = 0  # restarts in place + requeues so far

    def render(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True) + "\n"

    @classmethod
    def parse(cls, text: str) -> Beat | None:
        """A beat from the file's text; ``None`` for anything else (half written)."""
        try:
            value = json.loads(text)
            beat = cls(**value) if isinstance(value, dict) else None
        except (ValueError, TypeError):
            return None
        if beat is None or beat.state not in STATES:
            return None
        return beat

    @property
    def seen(self) -> tuple[int, int, str]:
        """What tells one write from another."""
        return self.pid, self.count, self.state

    def clock(self) -> str:
        """When written, as the job's log writes times."""
        return stamp(self.time)


def beat_path(log_dir: Path, job_id: str) -> Path:
    return log_dir / BEAT_NAME.format(job=job_id)


def read_beat(path: Path) -> Beat | None:
    try:
        return Beat.parse(path.read_text(errors="replace"))
    except OSError:
        return None


def write_beat(path: Path, beat: Beat) -> None:
    """Rewrite the file in place with one write; a file system error is not the job's."""
    with contextlib.suppress(OSError), path.open("w") as handle:
        handle.write(beat.render())


class Heartbeat:
    """The supervisor's writer: a pulse on the keeper's pipe (``pipe``, -1 without one)
    and a rewrite of the file every ``every`` seconds, the state asked of ``state`` at
    each beat; :meth:`now` writes at once (a new state)."""

    def __init__(
        self, path: Path, base: Beat, every: float, state: Callable[[], str], pipe: int = -1
    ) -> None:
        self.path, self.base, self.every, self.state_of, self.pipe = path, base, every, state, pipe
        self.count = base.count
        self.attempt = base.attempt
        self.written: tuple[int, int, str] | None = None  # our last write (Beat.seen)
        self.usurped = False  # another wrote the file since: the job moved on without us
        self.lock = threading.RLock()  # also taken in a signal handler of the main thread
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="slurmtf-heartbeat", daemon=True)

    def start(self) -> None:
        self.now()
        self.thread.start()

    def now(self) -> None:
        """Pulse and write the current state (from the supervisor's main thread or the
        heartbeat's own)."""
        with self.lock:
            if self.pipe >= 0:
                with contextlib.suppress(OSError):
                    os.write(self.pipe, PULSE)
            found = read_beat(self.path) if self.written is not None else None
            if found is not None and found.seen != self.written:
                self.usurped = True
            if self.usurped:
                return
            self.count += 1
            beat = dataclasses.replace(
                self.base, count=self.count, time=time.time(), state=self.state_of(),
                attempt=self.attempt,
            )  # fmt: skip
            write_beat(self.path, beat)
            self.written = beat.seen

    def stop(self) -> None:
        """The last write (the final state), then the thread ends."""
        self.done.set()
        if self.thread.is_alive():
            self.thread.join(timeout=self.every + 5)
        self.now()

    def _run(self) -> None:
        while not self.done.wait(self.every):
            self.now()
