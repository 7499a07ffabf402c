"""The edge of :mod:`slurmtf.runtime.recovery`: an attempt's evidence from its logs, the
job's restart record, and the decision (for the supervisor and ``--cluster=local``).

What one attempt left: srun's exit status and its ``task N: ...`` lines (in the file its
stderr is appended to), and each rank's JSON event lines and error output, all read from
where the attempt started in each file (the offsets the supervisor noted before the
step). Nothing here reads human progress text: the ranks' ``peer_lost``, ``stalled``,
``serving``, ``preempted`` and ``exit`` events say what happened.

Every restart in place and every requeue appends one JSON line to the job's record
(:func:`record_path`: ``recovery-<job>.jsonl`` in the log folder), which counts the one
budget across requeues and which ``slurmtf status`` shows.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slurmtf.contracts import rank_error_line
from slurmtf.events import Event, named, parse_events
from slurmtf.runtime.endings import Attempt, TaskEnding
from slurmtf.runtime.node_choice import Nodes
from slurmtf.runtime.recovery import Budget, Decision, after_check, as_requeue, decide
from slurmtf.runtime.slurm_calls import drained_nodes, probe_dead
from slurmtf.slurm.runner import Runner, default_runner

RECORD_NAME = "recovery-{job}.jsonl"
_NODE_FAILURE = re.compile(r"Node failure on (\S+)")
_MISSING = re.compile(r"No module named '([A-Za-z_]+)'")  # a package, not a module of it
INSTALL_LINE = 'pip install "slurmtf[gpu]" (or [cpu]; README, "Install on a cluster")'


@dataclasses.dataclass(frozen=True)
class LogFiles:
    """Where an attempt's output is: the log folder, how rank R's files are named
    (``<prefix>R<suffix>.out|.err``), srun's stderr, and where this attempt starts in each
    file (bytes; a file not named starts at 0)."""

    log_dir: Path
    prefix: str = "rank"
    suffix: str = ""
    srun_err: Path | None = None
    offsets: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def new_text(self, path: Path) -> str:
        """What this attempt appended to ``path`` ("" when it cannot be read)."""
        try:
            with path.open("rb") as handle:
                handle.seek(self.offsets.get(str(path), 0))
                return handle.read().decode(errors="replace")
        except OSError:
            return ""

    def ranks(self) -> list[int]:
        found = set()
        for path in self.log_dir.glob(f"{glob_escape(self.prefix)}*{glob_escape(self.suffix)}.*"):
            middle = path.stem[len(self.prefix) : len(path.stem) - len(self.suffix)]
            if middle.isdigit():
                found.add(int(middle))
        return sorted(found)

    def rank_file(self, rank: int, kind: str) -> Path:
        return self.log_dir / f"{self.prefix}{rank}{self.suffix}.{kind}"


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def read_attempt(status: int, files: LogFiles, python: str = "python3") -> Attempt:
    """The evidence of the attempt that just ended with srun's ``status``."""
    srun_text = files.new_text(files.srun_err) if files.srun_err else ""
    endings = tuple(
        e for e in (TaskEnding.parse(line) for line in srun_text.splitlines()) if e is not None
    )
    events = {r: parse_events(files.new_text(files.rank_file(r, "out"))) for r in files.ranks()}
    failed = tuple(dict.fromkeys(_NODE_FAILURE.findall(srun_text)))
    firsts = dict.fromkeys(e.ranks[0] for e in endings if e.ranks)
    errors = {r: own_error(files.new_text(files.rank_file(r, "err")), python) for r in firsts}
    return Attempt(status, endings, events, errors, failed)


def own_error(text: str, python: str = "python3") -> str:
    """The line of a rank's error output that says what went wrong, with a hint when it
    could not import slurmtf, its models or TensorFlow."""
    line = rank_error_line(text, failed=True)
    missing = _MISSING.search(text)
    name = missing.group(1) if missing else ""
    if name in ("slurmtf", "slurmtf_models", "tensorflow"):
        line += f". HINT: {python} on the nodes has no {name}: {python} -m {INSTALL_LINE}"
    elif name == "models":
        line += (
            ". HINT: models/ is in a checkout only (SLURMTF_REPO); installed, the models are "
            "slurmtf_models: write the job scripts again (slurmtf job-scripts DIR)"
        )
    return line


def record_path(log_dir: Path, job_id: str) -> Path:
    return log_dir / RECORD_NAME.format(job=job_id)


def read_record(log_dir: Path, job_id: str) -> list[dict[str, Any]]:
    """The job's decisions so far (restarts in place, requeues, the final stop)."""
    try:
        text = record_path(log_dir, job_id).read_text(errors="replace")
    except OSError:
        return []
    return [r for r in (_json(line) for line in text.splitlines()) if r is not None]


def _json(line: str) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def restarts_so_far(records: Sequence[Mapping[str, Any]], slurm_requeues: int) -> int:
    """Restarts in place + requeues: the recorded ones, plus Slurm's requeues that no
    decision of ours asked for (a node failure Slurm requeued itself)."""
    restarts = sum(1 for r in records if r.get("action") == "restart")
    requeues = sum(1 for r in records if r.get("action") == "requeue")
    return restarts + max(requeues, slurm_requeues)


def watch_step(
    files: LogFiles, nodes: Nodes, probed: Sequence[str], runner: Runner, timeout: float
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """:func:`probe_lost` of the nodes every rank's log says its peers lost so far (the
    supervisor reads them from the nodes' files instead: :func:`lost_in`)."""
    return probe_lost(read_attempt(0, files).lost_nodes(), nodes, probed, runner, timeout)


def lost_in(events: Sequence[Event], srun_text: str = "") -> tuple[str, ...]:
    """The nodes that ``peer_lost`` events among ``events`` name, in order of mention, then
    srun's failed nodes in ``srun_text`` (``Node failure on NODE``); none without such an
    event."""
    lost = named(events, "peer_lost")
    if not lost:
        return ()
    failed = tuple(dict.fromkeys(_NODE_FAILURE.findall(srun_text)))
    return Attempt(0, events={i: [e] for i, e in enumerate(lost)}, failed_nodes=failed).lost_nodes()


def probe_lost(
    lost: Sequence[str], nodes: Nodes, probed: Sequence[str], runner: Runner, timeout: float
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """While a step runs: those of the ``lost`` nodes (named by the ranks' ``peer_lost``
    events) that do not answer a probe, and every node probed so far that answered
    (``probed`` and the new ones), so that a node is probed once per step. The supervisor
    ends the step when the first is not empty: its srun would wait for a hung node until
    Slurm's SlurmdTimeout."""
    left_out = {*nodes.excluded, *probed}
    suspects = [n for n in lost if n not in left_out]
    dead = probe_dead(suspects, runner, timeout)
    alive = tuple(dict.fromkeys([*probed, *(n for n in suspects if n not in dead)]))
    return dead, alive


def write_record(path: Path, record: Mapping[str, Any]) -> None:
    """Append one line (one short write to a file opened for appending)."""
    with path.open("a") as handle:
        handle.write(json.dumps(dict(record)) + "\n")


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


def decide_and_record(
    step: Step, files: LogFiles, runner: Runner = default_runner
) -> tuple[Decision, str]:
    """Read the attempt, decide, record a restart/requeue/stop; the decision and its line.
    On this machine (``step.on_this_machine``: ``--cluster=local``) no node is probed or
    left out, and a requeue is a restart in place: there is no queue to go back to."""
    records = read_record(files.log_dir, step.job_id)
    budget = Budget(restarts_so_far(records, step.slurm_requeues), step.limit)
    if step.outliers:
        decision = after_check(step.outliers, budget, step.nodes)
        return _recorded(decision, step, files, budget.used, None)
    attempt = read_attempt(step.status, files, step.python)
    nodes = dataclasses.replace(step.nodes, dead=step.dead, kills=_kills(records, attempt))
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
    return _recorded(decision, step, files, budget.used, seconds, killed=attempt.killed_nodes())


def _suspects(attempt: Attempt, step: Step) -> tuple[str, ...]:
    """The lost nodes still worth probing: not left out already, not found silent, not
    found answering by the watch during the step."""
    known = {*step.nodes.excluded, *step.dead, *step.alive}
    return tuple(n for n in attempt.lost_nodes() if n not in known)


def _kills(records: Sequence[Mapping[str, Any]], attempt: Attempt) -> tuple[tuple[str, int], ...]:
    """How often ranks were killed on each node: the record's attempts and this one."""
    counts: dict[str, int] = {}
    for node in [*(n for r in records for n in r.get("killed") or ()), *attempt.killed_nodes()]:
        counts[str(node)] = counts.get(str(node), 0) + 1
    return tuple(counts.items())


def _recorded(
    decision: Decision,
    step: Step,
    files: LogFiles,
    attempt: int,
    seconds: float | None,
    *,
    killed: Sequence[str] = (),
) -> tuple[Decision, str]:
    """Append the decision to the job's record (not a success), with the nodes whose ranks
    were killed (``killed``: two kills on one node leave it out); the decision and its line."""
    line = decision.line(step.job_id, seconds)
    if decision.action != "done":
        record = {"time": round(time.time(), 3), "job_id": step.job_id, "attempt": attempt}
        record.update(action=decision.action, why=decision.why, status=decision.status)
        record.update(exclude=list(decision.exclude), line=line, ends=err_sizes(files))
        if decision.action == "restart":
            record.update(restart=decision.restart, seconds=seconds, nodes=list(decision.nodes))
        if killed:
            record.update(killed=list(killed))
        write_record(record_path(files.log_dir, step.job_id), record)
    return decision, line


KINDS = ("supervisor", "batch_host")  # decisions about the job's batch side


def record_batch_side(
    log_dir: Path, job_id: str, attempt: int, decision: Decision, line: str, *, kind: str,
    **extra: Any,
) -> None:  # fmt: skip
    """A decision about the job's batch side (``kind``: ``supervisor``, its own end;
    ``batch_host``, the node it ran on) appended to the job's record, with ``extra``
    (``host``, ``lost_at``, ...): ``slurmtf status`` and ``logs`` show its line."""
    record = {"time": round(time.time(), 3), "job_id": job_id, "attempt": attempt}
    record.update(action=decision.action, why=decision.why, status=decision.status)
    record.update(exclude=list(decision.exclude), line=line, kind=kind, **extra)
    write_record(record_path(log_dir, job_id), record)


def batch_side_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The lines of the record's decisions about the job's batch side, in order."""
    return [str(r["line"]) for r in records if r.get("kind") in KINDS and r.get("line")]


def err_sizes(files: LogFiles) -> dict[str, int]:
    """Where the attempt ended in each rank's error log: what comes before it is an
    earlier attempt's (``slurmtf status`` says so of its last error)."""
    sizes = {}
    for rank in files.ranks():
        try:
            sizes[str(rank)] = files.rank_file(rank, "err").stat().st_size
        except OSError:
            continue
    return sizes


def recovered_attempt(records: Sequence[Mapping[str, Any]], rank: int, offset: int) -> int | None:
    """The attempt a line at ``offset`` of ``rank``'s error log belongs to, when a restart
    or requeue followed that attempt (it was recovered); else ``None``."""
    for record in records:
        ends = record.get("ends") or {}
        end = ends.get(str(rank)) if isinstance(ends, dict) else None
        again = record.get("action") in ("restart", "requeue")
        if again and isinstance(end, int) and offset < end:
            attempt = record.get("attempt")
            return attempt if isinstance(attempt, int) else None
    return None


def in_place(records: Sequence[Mapping[str, Any]]) -> int:
    """How many restarts in place the job's record holds."""
    return sum(1 for r in records if r.get("action") == "restart")


def _since_failure(files: LogFiles) -> float | None:
    """Seconds since srun last wrote its stderr (its words about the failed task)."""
    try:
        return max(0.0, time.time() - files.srun_err.stat().st_mtime) if files.srun_err else None
    except OSError:
        return None
