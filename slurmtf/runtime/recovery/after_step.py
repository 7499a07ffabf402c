"""After a step: read the attempt, decide, record the decision (the edge of
:mod:`slurmtf.runtime.recovery.decision`, for the supervisor and ``--cluster=local``).

:func:`decide_and_record` reads the attempt (:mod:`~slurmtf.runtime.recovery.evidence`),
counts the budget from the job's record (:mod:`~slurmtf.runtime.recovery.record`), asks
Slurm which nodes are drained and probes the lost ones (:mod:`slurmtf.runtime.slurm_calls`),
decides, and appends the decision to the record.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

from slurmtf.runtime.recovery.budget import DEFAULT_MODE, Budget, Policy, count_budget
from slurmtf.runtime.recovery.decision import (
    Decision,
    after_check,
    as_requeue,
    decide,
)
from slurmtf.runtime.recovery.endings import Attempt
from slurmtf.runtime.recovery.evidence import LogFiles, read_attempt
from slurmtf.runtime.recovery.node_choice import Nodes
from slurmtf.runtime.recovery.record import (
    err_sizes,
    read_record,
    record_path,
    write_record,
)
from slurmtf.runtime.slurm_calls import drained_nodes, probe_dead
from slurmtf.slurm.runner import Runner, default_runner


@dataclasses.dataclass(frozen=True)
class Step:
    """What the supervisor knows about the step that ended and the job around it."""

    job_id: str
    status: int
    limit: int
    slurm_requeues: int = 0
    nodes: Nodes = dataclasses.field(default_factory=Nodes)
    probe_timeout: float = 10.0
    outliers: tuple[str, ...] = ()  # --check_first's verdict, before any step ran
    python: str = "python3"  # the job's interpreter, named in an install hint
    on_this_machine: bool = False  # --cluster=local: no queue, no node to leave out
    dead: tuple[str, ...] = ()  # nodes the watch found silent during the step (no probe again)
    alive: tuple[str, ...] = ()  # nodes the watch found answering during the step
    in_place: bool = True  # False (SLURMTF_RESTART_IN_PLACE=0): a restart is a requeue
    mode: str = DEFAULT_MODE  # RESTART_BUDGET: what MAX_RESTARTS counts
    per_hour: int = 0  # MAX_FAILURES_PER_HOUR (0: no limit)

    @property
    def policy(self) -> Policy:
        return Policy(self.limit, self.mode, self.per_hour)


def decide_and_record(
    step: Step, files: LogFiles, runner: Runner = default_runner
) -> tuple[Decision, str]:
    """Read the attempt, decide, record a restart/requeue/stop; the decision and its line.
    On this machine (``step.on_this_machine``: ``--cluster=local``) no node is probed or
    left out, and a requeue is a restart in place: there is no queue to go back to."""
    records = read_record(files.log_dir, step.job_id)
    if step.outliers:
        budget = count_budget(records, step.slurm_requeues, step.policy, None, time.time())
        decision = after_check(step.outliers, budget, step.nodes)
        return _recorded(decision, step, files, budget, None)
    attempt = read_attempt(step.status, files, step.python)
    budget = count_budget(records, step.slurm_requeues, step.policy, attempt.reached(), time.time())
    nodes = dataclasses.replace(step.nodes, dead=step.dead, crashes=_crashes(records, attempt))
    decision = decide(attempt, budget, nodes)
    if decision.action == "restart" and not step.on_this_machine:
        drained = drained_nodes(nodes.allocated, runner)
        nodes = dataclasses.replace(nodes, drained=drained)
        decision = decide(attempt, budget, nodes) if drained else decision
    if step.on_this_machine:
        if decision.action == "requeue":  # preempted: the ranks saved a checkpoint
            why = "preemption (checkpoint saved)"
            decision = dataclasses.replace(decision, action="restart", why=why)
    elif decision.action in ("restart", "requeue") and _suspects(attempt, step):
        suspects = _suspects(attempt, step)
        # Probed, not assumed: a rank that stopped sending heartbeats (a hung rank) may sit
        # on a node that answers; with --overlap a probe starts beside the old step.
        dead = probe_dead(suspects, runner, step.probe_timeout)
        nodes = dataclasses.replace(nodes, dead=tuple(dict.fromkeys([*step.dead, *dead])))
        decision = decide(attempt, budget, nodes)
    if not step.in_place and not step.on_this_machine:
        decision = as_requeue(decision)
    seconds = _since_failure(files)
    return _recorded(decision, step, files, budget, seconds, crashed=attempt.crashed_nodes())


def _suspects(attempt: Attempt, step: Step) -> tuple[str, ...]:
    """The lost nodes still worth probing: not left out already, not found silent, not
    found answering by the watch during the step."""
    known = {*step.nodes.excluded, *step.dead, *step.alive}
    return tuple(n for n in attempt.lost_nodes() if n not in known)


def _crashes(records: Sequence[Mapping[str, Any]], attempt: Attempt) -> tuple[tuple[str, int], ...]:
    """How often ranks crashed in their own way on each node: the record's attempts and
    this one (the record's ``killed`` of earlier releases counted any signal: not read)."""
    counts: dict[str, int] = {}
    for node in [*(n for r in records for n in r.get("crashed") or ()), *attempt.crashed_nodes()]:
        counts[str(node)] = counts.get(str(node), 0) + 1
    return tuple(counts.items())


def _recorded(
    decision: Decision,
    step: Step,
    files: LogFiles,
    budget: Budget,
    seconds: float | None,
    *,
    crashed: Sequence[str] = (),
) -> tuple[Decision, str]:
    """Append the decision to the job's record (not a success), with the nodes whose ranks
    crashed (``crashed``: two crashes on one node leave it out) and how far the attempt
    got (``reached``, ``progress``: what the budget counts); the decision and its line."""
    line = decision.line(step.job_id, seconds)
    if decision.action != "done":
        record: dict[str, Any] = {
            "time": round(time.time(), 3), "job_id": step.job_id, "attempt": budget.so_far
        }  # fmt: skip
        record.update(reached=budget.reached, progress=budget.progressed)
        record.update(action=decision.action, why=decision.why, status=decision.status)
        record.update(exclude=list(decision.exclude), line=line, ends=err_sizes(files))
        if decision.action == "restart":
            record.update(restart=decision.restart, seconds=seconds, nodes=list(decision.nodes))
        if crashed:
            record.update(crashed=list(crashed))
        write_record(record_path(files.log_dir, step.job_id), record)
    return decision, line


def _since_failure(files: LogFiles) -> float | None:
    """Seconds since srun last wrote its stderr (its words about the failed task)."""
    try:
        return max(0.0, time.time() - files.srun_err.stat().st_mtime) if files.srun_err else None
    except OSError:
        return None
