"""What follows a step of a job: done, a restart in place, a requeue, or a stop.

The pure core: :func:`decide` takes how one attempt ended (:class:`Attempt`: srun's exit
status, its ``task N: ...`` lines, each rank's event lines of that attempt), the restart
budget (:class:`Budget`) and the allocation's nodes (:class:`Nodes`), and returns a
:class:`Decision`:

* ``done``: every task ended with 0 (or only parameter-server workers were killed,
  which the chief's ClusterCoordinator tolerates);
* ``restart``: a rank was killed or crashed (a signal), lost a peer, saw a stall or found
  its port held by another process (the next attempt listens on other ports): a new
  srun step in the same allocation resumes from the last complete checkpoint; nodes that
  stopped answering, drained nodes and nodes whose ranks were killed twice are left out
  (``srun --exclude``) while at least ``Nodes.minimum`` remain;
* ``requeue``: the allocation cannot go on: preemption (exit 75) and the time limit end
  it, and too few nodes may be left (the job is requeued without the nodes left out);
* ``stop``: a rank's own deterministic error (exit 2, an exception), or the budget is spent.

Restarts in place and requeues share one budget (``MAX_RESTARTS``). The edge that reads the
logs and records the decision for the supervisor is :mod:`slurmtf.runtime.attempts`.
"""

from __future__ import annotations

import dataclasses
import re
import signal
from collections.abc import Mapping, Sequence
from typing import Any

from slurmtf.contracts import EXIT_FAILURE, EXIT_PREEMPTED, EXIT_USAGE, ending_signal
from slurmtf.errors import InputError
from slurmtf.runtime import held_port
from slurmtf.runtime.srun_status import tasks_status

ACTIONS = ("done", "restart", "requeue", "stop")
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
_TASK_LINE = re.compile(r"tasks? ([0-9][0-9,-]*): (.*)$")
_EXIT_CODE = re.compile(r"Exited with exit code (\d+)$")


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
    of a stop), and srun's ``Node failure on NODE`` nodes."""

    status: int
    endings: tuple[TaskEnding, ...] = ()
    events: Mapping[int, Sequence[Event]] = dataclasses.field(default_factory=dict)
    errors: Mapping[int, str] = dataclasses.field(default_factory=dict)
    failed_nodes: tuple[str, ...] = ()

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

    def lost_nodes(self) -> tuple[str, ...]:
        """Nodes of the peers the ranks lost (``peer_lost`` events) and srun's failed
        nodes, in order of first mention: the nodes worth probing."""
        nodes = [n for rank in sorted(self.events) for n in self._lost_by(rank)]
        return tuple(dict.fromkeys([*nodes, *self.failed_nodes]))

    def killed_nodes(self) -> tuple[str, ...]:
        """The nodes of the ranks srun saw end first, when a signal killed them (their
        nodes from the ranks' ``cluster`` events), each node once: a node that does this
        :data:`STRIKES` times is left out. The tasks srun ended after the first (its own end
        of the step: ``Terminated``, or ``Killed`` after KillWait) are not the node's doing:
        with 16 ranks a node they would strike every node at the first kill."""
        found = (e.get("workers") for r in self.events for e in self.of(r, "cluster"))
        workers: list[Any] = next((w for w in found if isinstance(w, list)), [])
        first = self.endings[0] if self.endings else None
        sig = first.signal if first is not None else None
        if first is None or sig is None or sig.startswith("a signal"):
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


@dataclasses.dataclass(frozen=True)
class Budget:
    """Restarts so far (in place + requeues, this job's whole life) and the limit."""

    used: int
    limit: int

    @property
    def spent(self) -> bool:
        return self.used >= self.limit


STRIKES = 2  # ranks on one node killed this often in a job's life: the node is left out


@dataclasses.dataclass(frozen=True)
class Nodes:
    """The allocation's nodes (Slurm's order), those left out already, the fewest a step
    may train on, those found dead after this attempt (probed by the edge), how many a
    step trains on (``width``: N of the N+``SPARE_NODES`` allocated; 0: every usable one)
    how often ranks were killed on each node in the job's life (``kills``) and the nodes
    Slurm reports drained or down (``drained``: an administrator or a health check took
    them out of service while the job held them)."""

    allocated: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    minimum: int = 0
    dead: tuple[str, ...] = ()
    width: int = 0
    kills: tuple[tuple[str, int], ...] = ()
    drained: tuple[str, ...] = ()

    def next_excluded(self) -> tuple[str, ...]:
        """Left out before, found dead now, then nodes whose ranks were killed
        :data:`STRIKES` times and drained nodes: none of them is used again. When too few
        nodes are left for the job (fewer than ``minimum``: no spare, no range, or a
        range whose minimum Slurm does not tell and ``MIN_NODES`` does not name), the
        decision is a requeue without them rather than a restart in place on them.
        Each once, in the order first seen."""
        struck = [n for n, count in self.kills if count >= STRIKES]
        drained = [n for n in self.drained if n in self.allocated]
        return tuple(dict.fromkeys([*self.excluded, *self.dead, *struck, *drained]))

    def usable(self) -> tuple[str, ...]:
        left_out = set(self.next_excluded())
        return tuple(n for n in self.allocated if n not in left_out)

    def step_nodes(self) -> tuple[str, ...]:
        """The next step's nodes: ``width`` of the usable ones in Slurm's order (a spare
        takes a lost node's place), or every usable one when fewer are left (a range)."""
        usable = self.usable()
        return usable[: self.width] if self.width else usable

    def first_step(self) -> tuple[str, ...]:
        """The nodes the first step trains on: the first ``width`` (the others are spares)."""
        return self.allocated[: self.width] if self.width else self.allocated

    def placement(self) -> str:
        """The next step's nodes in words, once some were left out: ``training on a spare
        (node4)`` or ``training on the 2 node(s) left``."""
        nodes = self.step_nodes()
        spares = [n for n in nodes if n not in self.first_step()]
        if spares:
            return f"training on a spare ({','.join(spares)})"
        if len(nodes) < len(self.first_step()):
            return f"training on the {len(nodes)} node(s) left (minimum {self.minimum})"
        return f"training on {','.join(nodes)}"


@dataclasses.dataclass(frozen=True)
class Decision:
    """What to do next: ``action`` (one of :data:`ACTIONS`), ``why`` (this attempt's
    ending in words), the job's exit ``status`` for ``stop``, the nodes to leave out of
    the next step or the requeued job, and ``restart``: the attempt number that follows
    (restarts in place + requeues)."""

    action: str
    why: str
    status: int = 0
    exclude: tuple[str, ...] = ()
    restart: int = 0
    limit: int = 0
    new_exclusions: tuple[str, ...] = ()
    note: str = ""  # a line to log first (workers tolerated while others failed)
    nodes: tuple[str, ...] = ()  # the next step's nodes (srun --nodelist), when some are out
    placement: str = ""  # those nodes in words (Nodes.placement)

    def line(self, job_id: str, seconds: float | None = None) -> str:
        """The job log's one line about this decision."""
        if self.action == "done":
            return self.why
        of = f"{self.restart} of {self.limit}"
        if self.action == "requeue":
            return f"{self.why}: requeueing job {job_id} (restart {of}, MAX_RESTARTS)"
        if self.action == "stop":
            return self.why
        after = f", {seconds:.0f} s after" if seconds is not None else " after"
        line = f"restart {of} in place (MAX_RESTARTS){after} {self.why}"
        if self.new_exclusions:
            line += f"; {','.join(self.new_exclusions)} left out"
        if self.placement:
            line += f"{',' if self.new_exclusions else ';'} {self.placement}"
        return line


def decide(attempt: Attempt, budget: Budget, nodes: Nodes = Nodes()) -> Decision:
    """The next step after ``attempt`` (see the module's docstring)."""
    # srun's status as the tasks give it, on every release (23.02+ exits 1 after a node
    # failure where 22.05 gave the tasks' status): slurmtf.runtime.srun_status.
    status = tasks_status(attempt.status, [e.status for e in attempt.endings], attempt.failed_nodes)
    attempt = dataclasses.replace(attempt, status=status)
    attempt, tolerated = tolerate_workers(attempt)
    if attempt.status == 0 and not attempt.preempted():
        why = "completed"
        if tolerated:
            why = (
                f"tolerated the loss of worker {tolerated}: the chief's script completed "
                "without it (ClusterCoordinator ran its work on the other workers)"
            )
        return Decision("done", why)
    if attempt.preempted():
        return _again(
            "requeue", "preempted after saving a checkpoint", EXIT_PREEMPTED, budget, nodes
        )
    note = f"tolerated the loss of worker {tolerated}; judging the attempt by the other tasks"
    decision = _after_failure(attempt, budget, nodes)
    return dataclasses.replace(decision, note=note) if tolerated else decision


def _after_failure(attempt: Attempt, budget: Budget, nodes: Nodes) -> Decision:
    why, retry = classify(attempt)
    status = attempt.status or EXIT_FAILURE
    if nodes.dead:
        why, retry = f"{','.join(nodes.dead)} stopped answering ({why})", True
    if not retry:
        if why.startswith("bad flags"):
            status = EXIT_USAGE
        return Decision("stop", f"failed: {why}; not restarted", status)
    action = "restart" if len(nodes.usable()) >= nodes.minimum else "requeue"
    return _again(action, why if action == "restart" else f"failed: {why}", status, budget, nodes)


def after_check(outliers: Sequence[str], budget: Budget, nodes: Nodes = Nodes()) -> Decision:
    """``--check_first`` found ``outliers``: leave them out of the training step while at
    least ``nodes.minimum`` remain (one restart), else requeue without them; with the
    budget spent, stop rather than train on them."""
    why = f"check_first found outlier node(s) {','.join(outliers)}"
    if budget.spent:
        return Decision(
            "stop",
            f"{why}; not training on an outlier node (MAX_RESTARTS={budget.limit} spent)",
            EXIT_FAILURE,
        )
    nodes = dataclasses.replace(nodes, dead=tuple(outliers))
    action = "restart" if len(nodes.usable()) >= nodes.minimum else "requeue"
    return _again(action, why, EXIT_FAILURE, budget, nodes)


def _again(action: str, why: str, status: int, budget: Budget, nodes: Nodes) -> Decision:
    """Restart or requeue within the budget; else stop with this attempt's status."""
    if budget.spent:
        text = why if why.startswith(("failed", "preempted")) else f"failed: {why}"
        return Decision(
            "stop",
            f"{text}; not restarted: already restarted {budget.used} time(s) "
            f"(MAX_RESTARTS={budget.limit})",
            status,
        )
    exclude = nodes.next_excluded()
    new = tuple(n for n in exclude if n not in nodes.excluded)
    decision = Decision(action, why, status, exclude, budget.used + 1, budget.limit, new)
    if action != "restart" or not exclude or not nodes.allocated:
        return decision
    return dataclasses.replace(decision, nodes=nodes.step_nodes(), placement=nodes.placement())


def as_requeue(decision: Decision) -> Decision:
    """A restart in place turned into a requeue (``SLURMTF_RESTART_IN_PLACE=0``: the path
    every failure took before restarts in place, kept to compare against)."""
    if decision.action != "restart":
        return decision
    why = decision.why if decision.why.startswith("failed") else f"failed: {decision.why}"
    return dataclasses.replace(decision, action="requeue", why=why, nodes=(), placement="")


def classify(attempt: Attempt) -> tuple[str, bool]:
    """Why ``attempt`` failed, and whether a restart may fix it. srun names the task that
    failed first; the others were stopped by ``--kill-on-bad-exit``. What happened
    decides, not which wrapper reported it: a task ended by a signal (directly or as exit
    128+N through a launcher) was killed and is retried; exit 2 never is; a rank that
    exited with its own error (no ``peer_lost`` or ``stalled`` event) is not; a rank whose
    port another process held (a ``port_in_use`` event) is, on other ports, unless the user
    fixed the base."""
    endings = attempt.endings
    if attempt.status == EXIT_USAGE or any(e.exit_code == EXIT_USAGE for e in endings):
        return "bad flags or settings (exit 2): a restart cannot fix them", False
    held = [e for rank in sorted(attempt.events) for e in attempt.of(rank, held_port.EVENT)]
    if held:  # a port held by another process: the node's state, not the rank's error
        return held_port.describe_held(held[0])
    first = next((e for e in endings if e.ranks), None)
    if first is not None:
        rank = first.ranks[0]
        sig = first.signal
        if sig is not None:
            return f"rank {rank} was killed by {sig}", True
        if attempt.of(rank, "peer_lost") or attempt.of(rank, "stalled"):
            return f"rank {rank} lost a peer or saw a stall", True
        own = attempt.errors.get(rank, "")
        return f"rank {rank} failed with its own error (exit code {first.exit_code}): {own}", False
    if attempt.failed_nodes or attempt.status >= 128:
        where = ", ".join(f"Node failure on {n}" for n in attempt.failed_nodes)
        return f"srun exited {attempt.status} ({where or 'killed'})", True
    return f"srun exited {attempt.status} without a lost peer, node or killed task", False


def tolerate_workers(attempt: Attempt) -> tuple[Attempt, str]:
    """A parameter-server job: the worker servers (``serving`` events with role
    ``worker``) that srun reports killed by a signal are tolerated. The attempt is then
    judged by the other tasks' endings alone (status 0 when none is left), so that a
    chief that failed after a worker was killed is judged by its own ending. Returns the
    attempt to judge and the tolerated ranks in words (``rank 4 (SIGKILL)``)."""
    if attempt.status == 0:
        return attempt, ""
    tolerated: list[str] = []
    others: list[TaskEnding] = []
    for ending in attempt.endings:
        sig = ending.signal
        workers = ending.ranks and all(_is_worker(attempt, r) for r in ending.ranks)
        if not workers or sig is None or sig.startswith("a signal"):
            others.append(ending)
            continue
        tolerated.extend(f"rank {r} ({sig})" for r in ending.ranks)
    if not tolerated:
        return attempt, ""
    status = attempt.status if others else 0
    return dataclasses.replace(attempt, status=status, endings=tuple(others)), ", ".join(tolerated)


def _is_worker(attempt: Attempt, rank: int) -> bool:
    return any(e.get("role") == "worker" for e in attempt.of(rank, "serving"))


def job_nodes(allocated: Sequence[str], spare_nodes: str = "", min_nodes: str = "") -> Nodes:
    """The job script's ``SPARE_NODES`` and ``MIN_NODES`` (as typed; "" when unset) over
    the allocation: train on the first N of N+``SPARE_NODES`` nodes; after a node loss go
    on with no fewer than ``MIN_NODES`` (default: N). An :class:`InputError` names the
    variable, its value and the fix."""
    total = len(allocated)
    spares = _count("SPARE_NODES", spare_nodes or "0", "e.g. SPARE_NODES=1")
    if total and spares >= total:
        raise InputError(
            "SPARE_NODES", spares, f"leaves none of the job's {total} node(s) to train on",
            f"ask for the training nodes plus the spares (sbatch -N{spares + 2} with "
            f"SPARE_NODES={spares} trains on 2 nodes)",
        )  # fmt: skip
    width = total - spares
    least = _count("MIN_NODES", min_nodes, "e.g. MIN_NODES=2") if min_nodes else width
    if total and not 1 <= least <= width:
        raise InputError(
            "MIN_NODES", least, f"must be 1..{width} (the nodes the job trains on)",
            f"MIN_NODES={min(2, width)} with sbatch --nodes={min(2, width)}-{width}, or unset it",
        )  # fmt: skip
    return Nodes(tuple(allocated), minimum=least, width=width if spares else 0)


def _count(name: str, text: str, hint: str) -> int:
    if not text.strip().isdigit():
        raise InputError(name, text, "is not a node count", hint)
    return int(text)
