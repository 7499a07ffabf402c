"""What follows a step of a job: done, a restart in place, a requeue, or a stop.

The pure core: :func:`decide` takes how one attempt ended (:class:`Attempt`, read in
:mod:`slurmtf.runtime.recovery.endings`: srun's exit status, its ``task N: ...`` lines, each
rank's event lines of that attempt), the restart
budget (:class:`Budget`) and the allocation's nodes (:class:`Nodes`, chosen in
:mod:`slurmtf.runtime.recovery.node_choice`), and returns a :class:`Decision`:

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

Two decisions concern the job's batch side rather than a step: :func:`after_supervisor`
(the supervisor itself died on a healthy host: its keeper starts it again in place) and
:func:`after_batch_host` (the watcher found the batch host lost: requeue without it).
With the budget spent, both stop.

Restarts in place and requeues share one budget (``MAX_RESTARTS``; what it counts:
:mod:`slurmtf.runtime.recovery.budget`). The edge that reads the
logs and records the decision for the supervisor is :mod:`slurmtf.runtime.recovery.after_step`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from slurmtf.contracts import EXIT_FAILURE, EXIT_PREEMPTED, EXIT_USAGE
from slurmtf.runtime.rank import held_port
from slurmtf.runtime.recovery.budget import Budget
from slurmtf.runtime.recovery.endings import Attempt, TaskEnding, tasks_status
from slurmtf.runtime.recovery.node_choice import Nodes

NO_NODES = Nodes()  # no allocation known: nothing to leave out or choose


@dataclasses.dataclass(frozen=True)
class Decision:
    """What to do next: ``action`` (``done``, ``restart``, ``requeue`` or ``stop``),
    ``why`` (this attempt's ending in words), the job's exit ``status`` for ``stop``, the
    nodes to leave out of the next step or the requeued job, and ``restart``: the attempt
    number that follows (restarts in place + requeues)."""

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
    counted: str = ""  # the restart as the budget counts it (Budget.counted; "" for total)
    resume: str = ""  # where the next start resumes (Attempt.resume_words), when known

    def line(self, job_id: str, seconds: float | None = None) -> str:
        """The job log's one line about this decision."""
        if self.action == "done":
            return self.why
        of, rule = f"{self.restart} of {self.limit}", "MAX_RESTARTS"
        if self.counted:
            of, rule = str(self.restart), f"{self.counted}, MAX_RESTARTS"
        resume = f"; {self.resume}" if self.resume else ""
        if self.action == "requeue":
            return f"{self.why}: requeueing job {job_id} (restart {of}, {rule}){resume}"
        if self.action == "stop":
            return self.why
        after = f", {seconds:.1f} s after" if seconds is not None else " after"
        line = f"restart {of} in place ({rule}){after} {self.why}"
        if self.new_exclusions:
            line += f"; {','.join(self.new_exclusions)} left out"
        if self.placement:
            line += f"{',' if self.new_exclusions else ';'} {self.placement}"
        return line + resume


def decide(attempt: Attempt, budget: Budget, nodes: Nodes = NO_NODES) -> Decision:
    """The next step after ``attempt`` (see the module's docstring)."""
    # srun's status as the tasks give it, on every release (23.02+ exits 1 after a node
    # failure where 22.05 gave the tasks' status): slurmtf.runtime.recovery.endings.
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
    decision = _again(
        action, why if action == "restart" else f"failed: {why}", status, budget, nodes
    )
    if decision.action == "stop":
        return decision
    return dataclasses.replace(decision, resume=attempt.resume_words())


def after_check(outliers: Sequence[str], budget: Budget, nodes: Nodes = NO_NODES) -> Decision:
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
        return Decision("stop", f"{text}; not restarted: {budget.why_spent()}", status)
    exclude = nodes.next_excluded()
    new = tuple(n for n in exclude if n not in nodes.excluded)
    decision = Decision(action, why, status, exclude, budget.so_far + 1, budget.limit, new)
    decision = dataclasses.replace(decision, counted=budget.counted())
    if action != "restart" or not exclude or not nodes.allocated:
        return decision
    return dataclasses.replace(decision, nodes=nodes.step_nodes(), placement=nodes.placement())


def restart_without(nodes: Nodes, lost: Sequence[str]) -> Decision | None:
    """The restart in place :func:`decide` chooses when the ``lost`` nodes stop answering
    and nothing else changed (a spare or the nodes left of a range take their place, as
    in :func:`_again`); None when too few nodes would remain (a requeue). The next
    attempt's warm ranks start there before the ranks report the loss."""
    after = dataclasses.replace(nodes, dead=tuple(lost))
    usable = after.usable()
    if not after.allocated or not usable or len(usable) < after.minimum:
        return None
    return Decision("restart", "", exclude=after.next_excluded(), nodes=after.step_nodes())


def after_supervisor(why: str, budget: Budget) -> Decision:
    """The supervisor itself ended without the job's status (``why``: killed, an uncaught
    exception, stopped beating) while its batch host is healthy: its keeper starts it
    again in place, which costs a restart of the budget; with the budget spent, stop."""
    return _again("restart", why, EXIT_FAILURE, budget, NO_NODES)


def after_batch_host(why: str, host: str, budget: Budget) -> Decision:
    """The batch host was lost or its supervisor stays silent (``why``, seen by the watcher
    from another node): requeue the job without ``host``, within the budget; with the
    budget spent, stop (the watcher then cancels the job rather than hold its nodes)."""
    nodes = Nodes((host,), dead=(host,)) if host else NO_NODES
    return _again("requeue", why, EXIT_FAILURE, budget, nodes)


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
    fixed the base; a step srun could not launch on a node is (the node is probed first,
    and left out when it does not answer)."""
    endings = attempt.endings
    if attempt.status == EXIT_USAGE or any(e.exit_code == EXIT_USAGE for e in endings):
        return "bad flags or settings (exit 2): a restart cannot fix them", False
    node_state = _node_state(attempt)
    if node_state is not None:
        return node_state
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


def _node_state(attempt: Attempt) -> tuple[str, bool] | None:
    """A failure of a node's state rather than of a rank: a port another process held, or
    a step srun could not launch on a node (the tasks' endings then follow from srun
    ending the step); ``None`` otherwise."""
    held = [e for rank in sorted(attempt.events) for e in attempt.of(rank, held_port.EVENT)]
    if held:
        return held_port.describe_held(held[0])
    if attempt.launch_failed:
        return f"srun could not launch the step's tasks on {','.join(attempt.launch_failed)}", True
    return None


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
