"""The keeper: the batch script's own process, which outlives its supervisor.

Every job script execs ``slurmtf job KIND``, which becomes the batch step's main process:
Slurm ends the job the moment that process ends, and every step with it. So that
process does nothing that can fail. It forks the supervisor (:mod:`slurmtf.runtime.
supervisor`) and waits for it, reading a pipe on which the supervisor's heartbeat
pulses every few seconds (:mod:`slurmtf.runtime.batch_host.heartbeat`). How the supervisor ends:

* it returns the job's status (``=N`` on the pipe): the keeper exits with it;
* it is killed (SIGKILL, the OOM killer), dies of an uncaught exception (``!`` and its
  last words on the pipe), or stops pulsing for :data:`STUCK_BEATS` beats (SIGSTOP, a
  hang: the keeper then kills it): the keeper ends what it left (the process groups of
  its srun children, which are the keeper's children once their parent is gone: it is
  their subreaper), marks the heartbeat ``restarting`` and starts it again, telling the
  new supervisor how the old one ended (:class:`Ending`). The new one decides (a restart
  in place within ``MAX_RESTARTS``, or a stop), records it and ends the old steps;
* SIGTERM (the job cancelled, at its time limit, requeued by Slurm): passed on, and no
  supervisor is started again. USR1 and USR2 are passed on too.

The keeper restarts at most ``limit`` times in one allocation, whatever the supervisor
records, so that a supervisor that dies before it can decide cannot loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from slurmtf.runtime.batch_host.heartbeat import PULSE, STUCK_BEATS, Beat, read_beat, write_beat
from slurmtf.runtime.batch_host.keeper_death import set_title, watch_keeper
from slurmtf.runtime.job_log import log, stamp
from slurmtf.runtime.recovery.endings import signal_name

PASSED_ON = (signal.SIGUSR1, signal.SIGUSR2)
ENDING = (signal.SIGTERM, signal.SIGINT)
_PR_SET_CHILD_SUBREAPER = 36


@dataclasses.dataclass(frozen=True)
class Ending:
    """How a supervisor ended without returning the job's status."""

    pid: int
    host: str
    at: float  # epoch seconds: its end, or its last beat when it stopped beating
    status: int = 0  # exit status, or 128+N for signal N
    error: str = ""  # the last line of its uncaught exception
    stuck: float = 0.0  # seconds without a beat before the keeper killed it

    def words(self) -> str:
        """``was killed by SIGKILL ... at TIME`` and the like, after ``the supervisor (...)``."""
        at = stamp(self.at)
        if self.stuck:
            return (f"stopped beating at {at} (stopped or hung); its keeper killed it "
                    f"{self.stuck:.0f} s later")  # fmt: skip
        if self.error:
            return f"died of an uncaught exception at {at}: {self.error}"
        if self.status > 128:
            name = signal_name(self.status - 128)
            oom = " (the OOM killer or kill -9)" if name == "SIGKILL" else ""
            return f"was killed by {name}{oom} at {at}"
        return f"exited {self.status} without the job's status at {at}"

    def who(self) -> str:
        where = f" on {self.host}" if self.host else ""
        return f"the supervisor (pid {self.pid}{where})"


Supervise = Callable[[int, "Ending | None"], int]  # (pipe to the keeper, the last end) -> status


class Keeper:
    """Runs ``supervise`` in a child until it returns the job's status."""

    def __init__(
        self,
        supervise: Supervise,
        beat_path: Path,
        base: Beat,
        beat_s: float,
        limit: int,
        *,
        kind: str = "",
    ) -> None:
        self.supervise, self.beat_path, self.base, self.kind = supervise, beat_path, base, kind
        self.beat_s, self.limit = beat_s, limit
        self.child = 0
        self.ending = False  # SIGTERM or SIGINT: never start another supervisor

    def run(self) -> int:
        """The job's status; the process's signal handlers as they were afterwards."""
        before = {s: signal.getsignal(s) for s in (*PASSED_ON, *ENDING)}
        if self.kind:  # the job's own process; a keeper inside another program keeps its title
            set_title(f"slurmtf job {self.kind} (keeper)", "slurmtf-keeper")
        _subreaper(True)
        for signum in before:
            signal.signal(signum, self._signal)
        try:
            return self._keep()
        finally:
            _subreaper(False)
            for signum, handler in before.items():
                signal.signal(signum, handler)

    def _keep(self) -> int:
        previous: Ending | None = None
        starts = 0
        while True:
            before = set(_children(os.getpid()))  # not the supervisor's: never touched
            status, ending = self._once(previous)
            starts += 1
            self._end_orphans(before)
            if status is not None:
                return status
            if self.ending:
                return ending.status or 128 + signal.SIGTERM
            if starts > self.limit:
                log(f"{ending.who()} {ending.words()}; not started again: the keeper started "
                    f"it {self.limit} time(s) in this allocation", error=True)  # fmt: skip
                return 1
            log(f"{ending.who()} {ending.words()}: the keeper starts it again", error=True)
            self._mark_restarting(ending)
            previous = ending

    def _once(self, previous: Ending | None) -> tuple[int | None, Ending]:
        """One supervisor from its fork to its end: the job's status, or how it ended."""
        read_end, write_end = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        keeper = os.getpid()
        pid = os.fork()
        if pid == 0:  # the supervisor
            watch_keeper(keeper)  # before anything else: the keeper may die at any time
            set_title(f"slurmtf job {self.kind} (supervisor)", "slurmtf-superv")
            os.close(read_end)
            _child(self.supervise, write_end, previous)
        os.close(write_end)
        self.child = pid
        try:
            return self._wait(pid, read_end)
        finally:
            os.close(read_end)
            self.child = 0

    def _wait(self, pid: int, pipe: int) -> tuple[int | None, Ending]:
        """Read the pipe until it closes; kill a supervisor that stopped pulsing."""
        said, last, stuck = b"", time.monotonic(), 0.0
        while True:
            try:
                ready, _, _ = select.select([pipe], [], [], self.beat_s)
            except InterruptedError:  # a signal (passed on by its handler)
                continue
            if ready:
                data = os.read(pipe, 4096)
                if not data:
                    break
                said = (said + data.replace(PULSE, b""))[-4096:]
                last = time.monotonic()
                continue
            silent = time.monotonic() - last
            if silent >= STUCK_BEATS * self.beat_s and not self.ending and not stuck:
                stuck = silent
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        status = _wait_status(pid)
        final, error = _read_said(said.decode(errors="replace"))
        if final is not None and not stuck:
            return final, Ending(pid, self.base.host, time.time(), final)
        return None, Ending(pid, self.base.host, time.time() - stuck, status, error, stuck)

    def _mark_restarting(self, previous: Ending) -> None:
        old = read_beat(self.beat_path) or self.base
        beat = dataclasses.replace(
            old, pid=previous.pid, keeper=os.getpid(), count=old.count + 1, time=time.time(),
            state="restarting",
        )  # fmt: skip
        write_beat(self.beat_path, beat)

    def _end_orphans(self, before: set[int]) -> None:
        """Kill the process group of every child the keeper adopted while its supervisor
        ran (the srun steps of a supervisor that is gone: children that were not there
        before) and reap them."""
        orphans = [pid for pid in _children(os.getpid()) if pid not in before]
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # srun and what it started (a session each)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while orphans and time.monotonic() < deadline:
            for pid in list(orphans):
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0] == 0:
                        continue
                orphans.remove(pid)
            time.sleep(0.05)

    def _signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum in ENDING:
            self.ending = True
        if self.child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, signum)


def _child(supervise: Supervise, pipe: int, previous: Ending | None) -> None:
    """The forked supervisor: its status on the pipe, or its last words; never returns."""
    for signum in (*PASSED_ON, *ENDING):
        signal.signal(signum, signal.SIG_DFL)
    status = 1
    try:
        status = supervise(pipe, previous)
        message = f"={status}\n"
    except BaseException as exc:  # every way out is told to the keeper
        traceback.print_exc()
        last = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        message = f"!{last}\n"
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    with contextlib.suppress(OSError):
        os.write(pipe, message.encode())
    os._exit(status)


def _read_said(text: str) -> tuple[int | None, str]:
    """The final status (``=N``) or the last words (``!...``) on the pipe."""
    final, error = None, ""
    for line in text.splitlines():
        if line.startswith("=") and line[1:].isdigit():
            final = int(line[1:])
        elif line.startswith("!"):
            error = line[1:]
    return final, error


def _wait_status(pid: int) -> int:
    """The child's exit status as a shell reports it (128+N for signal N)."""
    try:
        _, raw = os.waitpid(pid, 0)
    except ChildProcessError:
        return 1
    if os.WIFSIGNALED(raw):
        return 128 + os.WTERMSIG(raw)
    return os.WEXITSTATUS(raw)


def _children(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry.name))
    return found


def _subreaper(on: bool) -> None:
    """Orphans of the supervisor (its srun steps once it is gone) become this process's
    children, inside the batch step, instead of init's (Linux ``prctl``)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)
