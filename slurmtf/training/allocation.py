"""The allocation in TensorBoard: what the chief writes beside its train and eval scalars.

Once per timing window (``--timing_every``, :mod:`.steptiming`) the chief writes each
rank's compute and wait time and its GPUs, the straggler reports and the job's goodput;
at each start, the restarts, requeues and preemptions of the job's recovery record it
has not written before. Everything here is a function of values and a
:class:`Writer`; the TensorFlow writer is :class:`slurmtf.training.export.AllocationWriter`.

Bounded by design: per-rank scalars for the first :data:`MAX_RANK_SCALARS` ranks only,
the min/median/max over all ranks always; one point per window, never per step.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from slurmtf.check.stragglers import RankSample, Report
from slurmtf.training.gpu_query import GpuSample
from slurmtf.training.model_spec import RunInfo
from slurmtf.training.steptiming import StepTiming

MAX_RANK_SCALARS = 16  # ranks with scalars of their own; all ranks: min/median/max
MAX_KEYS = 1000  # recovery lines remembered as written (the record is shorter)
STATE_NAME = "allocation.json"  # in the model directory, written by the chief


class Writer(Protocol):
    """Where the summaries go (TensorBoard's event file, or a list in tests)."""

    def scalars(self, step: int, values: Mapping[str, float]) -> None: ...

    def text(self, tag: str, step: int, value: str) -> None: ...


def rank_scalars(
    samples: Sequence[RankSample], max_ranks: int = MAX_RANK_SCALARS
) -> dict[str, float]:
    """One window's compute and wait seconds per step: per rank up to ``max_ranks`` ranks,
    and min/median/max over every rank."""
    out: dict[str, float] = {}
    for sample in samples[:max_ranks]:
        out[f"allocation/rank{sample.rank}/compute_s"] = sample.compute_s
        out[f"allocation/rank{sample.rank}/wait_s"] = sample.wait_s
    for name in ("compute_s", "wait_s"):
        values = [getattr(s, name) for s in samples]
        if values:
            out[f"allocation/{name}/min"] = min(values)
            out[f"allocation/{name}/median"] = statistics.median(values)
            out[f"allocation/{name}/max"] = max(values)
    return out


def straggler_summary(report: Report) -> tuple[dict[str, float], str]:
    """A ``straggler`` or ``straggler_recovered`` report as scalars and one text line.

    ``allocation/straggler/cost`` is the share of each step lost to it (0 once recovered);
    ``allocation/straggler/rank`` the rank named (-1: a link between nodes)."""
    found = report.finding
    recovered = report.event == "straggler_recovered"
    scalars = {
        "allocation/straggler/cost": 0.0 if recovered else found.cost,
        "allocation/straggler/rank": float(found.rank),
    }
    return scalars, report.message()


def gpu_scalars(rank: int, gpus: Sequence[GpuSample]) -> dict[str, float]:
    """Utilisation (%) and memory (MiB used, share) of each GPU of ``rank``'s node."""
    out: dict[str, float] = {}
    for gpu in gpus:
        prefix = f"allocation/rank{rank}/gpu{gpu.index}"
        out[f"{prefix}/utilization"] = gpu.utilization
        out[f"{prefix}/memory_used_mib"] = gpu.memory_used_mib
        if gpu.memory_total_mib > 0:
            out[f"{prefix}/memory_fraction"] = gpu.memory_used_mib / gpu.memory_total_mib
    return out


def rank_gpu_scalars(
    samples: Sequence[RankSample], max_ranks: int = MAX_RANK_SCALARS
) -> dict[str, float]:
    """Each rank's GPUs (utilisation %, MiB used, share of its memory), as its row of the
    step's all-reduce carried them: per rank up to ``max_ranks`` ranks, and min/median/max
    utilisation over every rank whose ``nvidia-smi`` answered."""
    out: dict[str, float] = {}
    answered = [s for s in samples if s.gpu is not None]
    for sample in answered:
        if sample.rank >= max_ranks or sample.gpu is None:
            continue
        util, used, total = sample.gpu
        prefix = f"allocation/rank{sample.rank}/gpu"
        out.update({f"{prefix}/utilization": util, f"{prefix}/memory_used_mib": used})
        out[f"{prefix}/memory_fraction"] = used / total if total > 0 else 0.0
    utils = [s.gpu[0] for s in answered if s.gpu is not None]
    if utils:
        out["allocation/gpu_utilization/min"] = min(utils)
        out["allocation/gpu_utilization/median"] = statistics.median(utils)
        out["allocation/gpu_utilization/max"] = max(utils)
    return out


def record_key(record: Mapping[str, Any]) -> str:
    """What identifies one line of the recovery record across starts."""
    return f"{record.get('time')}:{record.get('attempt')}:{record.get('action')}"


def recovery_text(record: Mapping[str, Any], cost: str = "") -> str:
    """One recovery decision as text: the action, its cause and its cost (``cost``, when
    the start after it measured it; else the seconds from the failure to the decision)."""
    action = str(record.get("action", "?"))
    parts = [f"{action} after attempt {record.get('attempt', '?')}"]
    if record.get("why"):
        parts.append(f"cause: {record['why']}")
    if record.get("status") is not None:
        parts.append(f"exit status {record['status']}")
    if cost:
        parts.append(f"cost: {cost}")
    elif isinstance(record.get("seconds"), int | float):
        parts.append(f"cost: {record['seconds']:.0f} s from the failure to the decision")
    text = "; ".join(parts)
    return f"{text}\n\n{record['line']}" if record.get("line") else text


def start_cost(record: Mapping[str, Any], now: float, redone: int) -> str:
    """What the decision cost, seen from the start after it: the seconds from the failure
    (the decision's time, less its ``seconds`` since the failure) to ``now``, and the
    steps this start computes again."""
    when = record.get("time")
    if not isinstance(when, int | float):
        return ""
    since = record.get("seconds") if isinstance(record.get("seconds"), int | float) else 0.0
    seconds = max(now - float(when) + float(since or 0.0), 0.0)
    steps = "step" if redone == 1 else "steps"
    return f"{seconds:.1f} s from the failure to this start, {redone} {steps} computed again"


def new_recovery(
    records: Sequence[Mapping[str, Any]], written: Sequence[str], now: float | None = None,
    redone: int = 0,
) -> list[tuple[str, str]]:  # fmt: skip
    """The records not written yet, as ``(key, text)`` in the record's order; the last
    one (the decision this start follows) with its cost when ``now`` is given."""
    seen = set(written)
    fresh = [r for r in records if record_key(r) not in seen]
    return [
        (
            record_key(r),
            recovery_text(r, start_cost(r, now, redone) if now and r is fresh[-1] else ""),
        )
        for r in fresh
    ]


@dataclasses.dataclass
class Goodput:
    """What the chief keeps across starts (``<model_dir>/allocation.json``).

    * ``steps``: steps trained / steps run, where steps run counts the steps a restart
      computed again (the last step reached minus the step restored from).
    * ``time``: seconds in timed training windows / wall seconds since the first start.
    """

    first_start: float | None = None
    train_s: float = 0.0
    steps_run: int = 0
    steps_redone: int = 0
    last_step: int = 0
    starts: int = 0
    written: list[str] = dataclasses.field(default_factory=list)

    def started(self, step: int, now: float) -> int:
        """A new start restored at ``step``: the steps it will compute again."""
        redone = max(self.last_step - step, 0)
        if self.first_start is None:
            self.first_start = now
        self.steps_redone += redone
        self.starts += 1
        self.last_step = step
        return redone

    def window(self, step: int, steps: int, seconds: float) -> None:
        self.steps_run += steps
        self.train_s += seconds
        self.last_step = max(self.last_step, step)

    def steps_ratio(self) -> float | None:
        if self.steps_run <= 0:
            return None
        return max(self.steps_run - self.steps_redone, 0) / self.steps_run

    def time_ratio(self, now: float) -> float | None:
        if self.first_start is None or now <= self.first_start:
            return None
        return min(self.train_s / (now - self.first_start), 1.0)

    @classmethod
    def load(cls, path: Path) -> Goodput:
        try:
            data = json.loads(path.read_text())
            fields = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in data.items() if k in fields})
        except (OSError, ValueError, TypeError):
            return cls()

    def save(self, path: Path) -> None:
        """Replace the file atomically (best effort: a full disk must not stop training)."""
        self.written = self.written[-MAX_KEYS:]
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps(dataclasses.asdict(self)))
            tmp.replace(path)
        except OSError:
            return


class Board:
    """The chief's allocation summaries over one start (see the module doc)."""

    def __init__(self, writer: Writer, state_path: Path, rank: int = 0, gpus: Any = None) -> None:
        self.writer = writer
        self.state_path = state_path
        self.rank = rank
        self.gpus = gpus  # slurmtf.training.gpu_query.GpuProbe, or None
        self.state = Goodput.load(state_path)
        self.max_ranks = MAX_RANK_SCALARS

    def at_start(
        self, step: int, restart_count: int, records: Sequence[Mapping[str, Any]], now: float
    ) -> None:
        """This start (its restart count, the steps it computes again) and the recovery
        decisions not written by an earlier start."""
        redone = self.state.started(step, now)
        self.writer.text(
            "allocation/starts",
            step,
            f"start {self.state.starts} (restart count {restart_count}) at step {step}; "
            f"steps computed again: {redone}",
        )
        for key, text in new_recovery(records, self.state.written, now, redone):
            self.writer.text("allocation/recovery", step, text)
            self.state.written.append(key)
        self.state.save(self.state_path)

    def window(
        self,
        step: int,
        samples: Sequence[RankSample],
        reports: Sequence[Report],
        *,
        seconds: float,
        steps: int,
        now: float,
        extra: Mapping[str, float] | None = None,
    ) -> None:
        """One timing window of ``steps`` steps in ``seconds`` (``extra``: more scalars of
        the window, a ``model.fit`` run's rates)."""
        values = {**rank_scalars(samples, self.max_ranks), **(extra or {})}
        for report in reports:
            scalars, text = straggler_summary(report)
            values.update(scalars)
            self.writer.text("allocation/straggler", step, text)
        values.update(rank_gpu_scalars(samples, self.max_ranks))
        if self.gpus is not None:  # model.fit: no rows, the chief's node asked here
            values.update(gpu_scalars(self.rank, self.gpus.latest()))
        self.state.window(step, steps, seconds)
        for name, ratio in (
            ("allocation/goodput/steps", self.state.steps_ratio()),
            ("allocation/goodput/time", self.state.time_ratio(now)),
        ):
            if ratio is not None:
                values[name] = ratio
        self.writer.scalars(step, values)
        self.state.save(self.state_path)

    def close(self) -> None:
        """Stop a ``nvidia-smi`` query still running."""
        if self.gpus is not None:
            self.gpus.close()


def recovery_records(job_id: str | None, log_dirs: Sequence[str | None]) -> list[dict[str, Any]]:
    """The job's recovery record (``recovery-<job>.jsonl``, as ``slurmtf status`` reads it)
    from the first of ``log_dirs`` (``--log_dir``, the user's record of the job) holding
    one; none without a job id."""
    from slurmtf.runtime.recovery.record import read_record

    for folder in log_dirs:
        if job_id and folder:
            found = read_record(Path(folder), job_id)
            if found:
                return found
    return []


def start_board(
    model_dir: str | None, info: RunInfo, log_dir: str | None, step: int, timing: StepTiming
) -> Board | None:
    """On the chief with a model directory: the board on ``<model_dir>/allocation``, this
    start written, listening to ``timing``'s windows; elsewhere ``None``."""
    if not (model_dir and info.is_chief):
        return None
    from slurmtf.training.export import AllocationWriter

    Path(model_dir).mkdir(parents=True, exist_ok=True)
    # Each rank's GPUs ride on the step's all-reduce (StepTiming): no probe of its own.
    board = Board(AllocationWriter(model_dir), Path(model_dir) / STATE_NAME, timing.rank)
    job_id = info.layout.job_id
    board.at_start(
        step,
        info.restart_count,
        recovery_records(job_id, job_log_dirs(job_id, log_dir)),
        time.time(),
    )
    timing.listener = board.window
    return board


def job_log_dirs(job_id: str | None, log_dir: str | None) -> list[str | None]:
    """Where the job's recovery record may be: ``--log_dir``, then the user's record."""
    from slurmtf.monitor import records

    place = records.lookup(job_id) if job_id else None
    return [log_dir, str(place.log_dir) if place else None]
