"""What one attempt left, read from its logs: the evidence :func:`slurmtf.runtime.recovery.
decision.decide` judges, and the nodes the ranks lost while a step runs.

srun's exit status and its ``task N: ...`` lines (in the file its stderr is appended to),
and each rank's JSON event lines and error output, all read from where the attempt
started in each file (the offsets the supervisor noted before the step: :class:`LogFiles`).
Nothing here reads human progress text: the ranks' ``peer_lost``, ``stalled``,
``serving``, ``preempted`` and ``exit`` events say what happened.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from slurmtf.contracts import INSTALL_LINE, rank_error_line
from slurmtf.events import Event, named, parse_events
from slurmtf.runtime.recovery.endings import Attempt, TaskEnding, reached_step
from slurmtf.runtime.recovery.node_choice import Nodes
from slurmtf.runtime.slurm_calls import probe_dead
from slurmtf.slurm.runner import Runner

_NODE_FAILURE = re.compile(r"Node failure on (\S+)")
_LAUNCH_FAILURE = re.compile(r"Task launch for StepId=\S+ failed on node ([^\s:]+)")
TAIL_BYTES = 256 * 1024  # how much of each rank's log tells how far training got
_MISSING = re.compile(r"No module named '([A-Za-z_]+)'")  # a package, not a module of it


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
    unlaunched = tuple(dict.fromkeys(_LAUNCH_FAILURE.findall(srun_text)))
    firsts = dict.fromkeys(e.ranks[0] for e in endings if e.ranks)
    errors = {r: own_error(files.new_text(files.rank_file(r, "err")), python) for r in firsts}
    return Attempt(status, endings, events, errors, failed, unlaunched)


def reached_in_logs(files: LogFiles, tail: int = TAIL_BYTES) -> int | None:
    """The highest step the ranks' logs report (``progress``, ``done``) in their last
    ``tail`` bytes: how far training got, for a decision taken outside a step (the
    supervisor's end, the batch host's loss); ``None`` when no rank reported a step."""
    steps = []
    for rank in files.ranks():
        try:
            with files.rank_file(rank, "out").open("rb") as handle:
                handle.seek(max(0, handle.seek(0, 2) - tail))
                text = handle.read().decode(errors="replace")
        except OSError:
            continue
        found = reached_step(parse_events(text))  # a cut first line is not an event
        if found is not None:
            steps.append(found)
    return max(steps) if steps else None


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


def lost_in(events: Sequence[Event], srun_text: str = "") -> tuple[str, ...]:
    """The nodes that ``peer_lost`` events among ``events`` name, in order of mention, then
    srun's failed nodes in ``srun_text`` (``Node failure on NODE``); none without such an
    event."""
    lost = named(events, "peer_lost")
    if not lost:
        return ()
    failed = tuple(dict.fromkeys(_NODE_FAILURE.findall(srun_text)))
    return Attempt(0, events={i: [e] for i, e in enumerate(lost)}, failed_nodes=failed).lost_nodes()


def survivors_saved(files: LogFiles, reports: Sequence[Event], lost: Sequence[str]) -> bool:
    """Whether every worker of this attempt off the ``lost`` nodes (the workers of rank
    0's ``cluster`` event, by host) has reported the loss (``peer_lost`` among
    ``reports``): each saved what it held from memory before it did, and is leaving, so
    ending the step needs no grace for a save. False when rank 0 named no workers."""
    clusters = named(parse_events(files.new_text(files.rank_file(0, "out"))), "cluster")
    workers = clusters[-1].get("workers") if clusters else None
    if not isinstance(workers, list) or not workers:
        return False
    hosts = [str(w).rsplit(":", 1)[0] for w in workers]
    expected = {rank for rank, host in enumerate(hosts) if host not in lost}
    return expected <= {e.get("rank") for e in named(reports, "peer_lost")}


def probe_lost(
    lost: Sequence[str],
    nodes: Nodes,
    probed: Sequence[str],
    runner: Runner,
    timeout: float,
    *,
    silent: Callable[[Sequence[str]], Sequence[str]] | None = None,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """While a step runs: those of the ``lost`` nodes (named by the ranks' ``peer_lost``
    events) that do not answer a probe, and every node probed so far that answered
    (``probed`` and the new ones), so that a node is probed once per step. The supervisor
    ends the step when the first is not empty: its srun would wait for a hung node until
    Slurm's SlurmdTimeout. Nodes that ``silent`` finds silent (the nodes' beacon,
    slurmtf.runtime.job.beacon) count as not answering without a probe."""
    left_out = {*nodes.excluded, *probed}
    suspects = [n for n in lost if n not in left_out]
    quiet = tuple(silent(suspects)) if silent is not None and suspects else ()
    asked = [n for n in suspects if n not in quiet]
    unanswered = {*quiet, *probe_dead(asked, runner, timeout)}
    dead = tuple(n for n in suspects if n in unanswered)
    alive = tuple(dict.fromkeys([*probed, *(n for n in suspects if n not in dead)]))
    return dead, alive
