"""How one attempt of a step ended: srun's ``task N: ...`` lines and each rank's events.

:class:`TaskEnding` reads one of srun's lines (``task 1: Killed``, ``tasks 3-4: Exited
with exit code 2``) as ranks and a reason, and says what srun counts it as (its status)
and which signal ended the task, whether srun saw the signal itself or a launcher
between srun and the model reported it as exit 128+N. :class:`Attempt` holds what one
attempt left (srun's status, those endings, each rank's event lines and own error line,
srun's failed nodes): the evidence :func:`slurmtf.runtime.recovery.decision.decide` judges. The
edge that reads it from the logs is :mod:`slurmtf.runtime.recovery.evidence`; ``--cluster=local``
writes srun's words for its ranks' endings (:func:`srun_words`).

srun's exit status after a node failure is read the same on every Slurm release
(:func:`tasks_status`). Slurm 22.05's srun returned the status of the tasks that reported
an ending (0 when only the failed node's tasks were lost) and wrote ``Node failure on
NODE``. From 23.02 it exits 1 instead whenever its step suffers a node failure ("srun -
return an error if step suffers a node failure": ``src/api/step_launch.c`` sets the
step's ``ret_code`` to 1 and ``src/srun/srun.c`` returns that in place of the tasks'
status), with the same words. :func:`tasks_status` gives back what the tasks say, as srun
computes it from them (``src/srun/launch.c`` ``_task_finish``: the highest signal wins, as
128+N; else the highest exit code; a task out of memory is 1), so that the decision is the
same on 22.05 and on 23.02 and later: a parameter-server job whose chief completed after a
worker's node failed is done on both.
"""

from __future__ import annotations

import dataclasses
import re
import signal
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from slurmtf.contracts import EXIT_FAILURE, EXIT_PREEMPTED, ending_signal

Event = dict[str, Any]

# srun's words for a task ended by a signal (its own process, no launcher between).
_SIGNAL_WORDS = (
    ("Killed", "SIGKILL"),
    ("Terminated", "SIGTERM"),
    ("Segmentation", "SIGSEGV"),
    ("Aborted", "SIGABRT"),
    ("Bus error", "SIGBUS"),
    ("Floating point", "SIGFPE"),
    ("Illegal instruction", "SIGILL"),
    ("Interrupt", "SIGINT"),
    ("Hangup", "SIGHUP"),
    ("User defined signal 1", "SIGUSR1"),
    ("User defined signal 2", "SIGUSR2"),
)
# The signals of a process's own crash: evidence against its node when they repeat there.
# Any other (SIGKILL, SIGTERM, SIGINT, SIGHUP, SIGUSR1/2) comes from outside.
OWN_CRASHES = frozenset({"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"})
_TASK_LINE = re.compile(r"tasks? ([0-9][0-9,-]*): (.*)$")
_EXIT_CODE = re.compile(r"Exited with exit code (\d+)$")
# srun's status after a node failure from Slurm 23.02 (22.05: the tasks' status; read the
# same on every release by tasks_status, docs/SLURM_VERSIONS.md).
NODE_FAILURE_STATUS = 1
PROGRESS_EVENTS = ("progress", "done")  # the events whose ``step`` says how far training got


@dataclasses.dataclass(frozen=True)
class TaskEnding:
    """One of srun's ``task 1: Killed`` / ``tasks 3-4: Exited with exit code 2`` lines."""

    ranks: tuple[int, ...]
    reason: str

    @classmethod
    def parse(cls, line: str) -> TaskEnding | None:
        found = _TASK_LINE.search(line.rstrip())
        if found is None:
            return None
        return cls(task_ranks(found.group(1)), found.group(2).strip())

    @property
    def exit_code(self) -> int | None:
        found = _EXIT_CODE.search(self.reason)
        return int(found.group(1)) if found else None

    @property
    def status(self) -> tuple[int, bool]:
        """This ending as srun counts it in its own status: ``(N, False)`` for exit code N,
        ``(128+N, True)`` for signal N; an ending srun names otherwise (out of memory) is 1."""
        code = self.exit_code
        if code is not None:
            return code, False
        name = self.signal or ""
        if name in signal.Signals.__members__:
            return 128 + signal.Signals[name].value, True
        return EXIT_FAILURE, False

    @property
    def signal(self) -> str | None:
        """``SIGKILL`` for a task ended by a signal, as srun says it (``Killed``) or as a
        launcher between srun and the model reports it (exit 128+N); ``None`` for a task
        that exited by itself."""
        code = self.exit_code
        if code is not None:
            sig = ending_signal(code)
            return sig.name if sig is not None else None
        for word, name in _SIGNAL_WORDS:
            if self.reason.startswith(word):
                return name
        return f"a signal ({self.reason})"


def srun_words(returncode: int) -> str:
    """What srun says of a task that ended with ``returncode`` (``subprocess``'s: ``-N``
    for a signal): ``Killed``, ``Exited with exit code 1``; ``--cluster=local`` writes it
    so that its ranks' endings are read as a step's are."""
    if returncode >= 0:
        return f"Exited with exit code {returncode}"
    name = signal_name(-returncode)
    word = next((w for w, n in _SIGNAL_WORDS if n == name), None)
    return word or f"Ended by signal {-returncode}"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def task_ranks(text: str) -> tuple[int, ...]:
    """The ranks of srun's ``4``, ``3-4`` or ``1,3-4``."""
    ranks: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            ranks.extend(range(int(low), int(high or low) + 1))
    return tuple(ranks)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """How one srun step ended: srun's status and ``task`` lines (first failure first),
    each rank's event lines of this attempt, each rank's own error line (for the message
    of a stop), srun's ``Node failure on NODE`` nodes and the nodes where it could not
    launch the step's tasks (``Task launch for StepId=... failed on node NODE: ...``: a
    slurmd that died or stopped answering as the step started)."""

    status: int
    endings: tuple[TaskEnding, ...] = ()
    events: Mapping[int, Sequence[Event]] = dataclasses.field(default_factory=dict)
    errors: Mapping[int, str] = dataclasses.field(default_factory=dict)
    failed_nodes: tuple[str, ...] = ()
    launch_failed: tuple[str, ...] = ()

    def of(self, rank: int, name: str) -> list[Event]:
        return [e for e in self.events.get(rank, ()) if e.get("event") == name]

    def preempted(self) -> bool:
        """Exit 75 from srun or from the first task it saw end, or rank 0's own word."""
        if self.status == EXIT_PREEMPTED:
            return True
        if self.endings and self.endings[0].exit_code == EXIT_PREEMPTED:
            return True
        if self.of(0, "preempted") or any(e.get("preempted") for e in self.of(0, "done")):
            return True
        return any(e.get("status") == EXIT_PREEMPTED for e in self.of(0, "exit"))

    def reached(self) -> int | None:
        """The highest step this attempt's ranks reported (``progress`` and ``done``
        events), ``None`` when none did (a script without slurmtf's training loop)."""
        return reached_step(e for rank in self.events for e in self.events[rank])

    def resume_words(self) -> str:
        """Where the next start resumes: ``resumes at step S from rank R's memory (K steps
        redone)`` when survivors saved from memory (``rescued`` events); when the ranks
        trained (slurmtf's loop) but none saved (every rank lost at once: a node or the
        whole allocation), ``no rank saved step S from memory: resumes from the last
        periodic checkpoint``; else ""."""
        saves = [(e["step"], -r) for r in self.events for e in self.of(r, "rescued")
                 if isinstance(e.get("step"), int)]  # fmt: skip
        if not saves:
            reached = self.reached()
            if not reached:
                return ""
            return (
                f"no rank saved step {reached} from memory: "
                "resumes from the last periodic checkpoint"
            )
        step, rank = max(saves)
        redone = max((self.reached() or 0) - step, 0)
        steps = "step" if redone == 1 else "steps"
        return f"resumes at step {step} from rank {-rank}'s memory ({redone} {steps} redone)"

    def lost_nodes(self) -> tuple[str, ...]:
        """Nodes of the peers the ranks lost (``peer_lost`` events), srun's failed nodes
        and those it could not launch on, in order of first mention: the nodes worth
        probing."""
        nodes = [n for rank in sorted(self.events) for n in self._lost_by(rank)]
        return tuple(dict.fromkeys([*nodes, *self.failed_nodes, *self.launch_failed]))

    def crashed_nodes(self) -> tuple[str, ...]:
        """The nodes of the ranks srun saw end first, when they crashed in their own way
        (:data:`OWN_CRASHES`; their nodes from the ranks' ``cluster`` events), each node
        once: a node that does this :data:`STRIKES` times is left out. A signal from
        outside (SIGKILL of the OOM killer or of anyone, SIGTERM, ...) is no evidence
        against the node. The tasks srun ended after the first (its own end of the step)
        are not the node's doing either."""
        found = (e.get("workers") for r in self.events for e in self.of(r, "cluster"))
        workers: list[Any] = next((w for w in found if isinstance(w, list)), [])
        first = self.endings[0] if self.endings else None
        if first is None or first.signal not in OWN_CRASHES:
            return ()
        nodes = (str(workers[r]).rsplit(":", 1)[0] for r in first.ranks if r < len(workers))
        return tuple(dict.fromkeys(nodes))

    def _lost_by(self, rank: int) -> list[str]:
        return [
            str(peer["node"])
            for e in self.of(rank, "peer_lost")
            for peer in e.get("lost", ())
            if isinstance(peer, dict) and peer.get("node")
        ]


def reached_step(events: Iterable[Event]) -> int | None:
    """The highest ``step`` of the ``progress`` and ``done`` events among ``events``."""
    steps = [
        e["step"]
        for e in events
        if e.get("event") in PROGRESS_EVENTS and isinstance(e.get("step"), int)
    ]
    return max(steps) if steps else None


def tasks_status(
    status: int, endings: Sequence[tuple[int, bool]], failed_nodes: Sequence[str]
) -> int:
    """srun's ``status`` without the 1 that 23.02+ puts in place of the tasks' status after
    a node failure: when srun named failed nodes and exited 1 that no task's ending
    explains (``endings``: each reported task's status and whether a signal ended it, as
    ``(128+N, True)``), the status the tasks give (0 when none reported an ending); else
    ``status`` unchanged."""
    codes = [code for code, _ in endings]
    if not failed_nodes or status != NODE_FAILURE_STATUS or NODE_FAILURE_STATUS in codes:
        return status
    signals = [code for code, by_signal in endings if by_signal]
    return max(signals or codes or [0])
