"""A job's state and logs: the library behind ``slurmtf status|logs|cancel JOB``
(:mod:`slurmtf.cli.jobs`) and the follower behind ``submit --wait``.

State comes from ``squeue``/``scontrol`` while Slurm still knows the job, from ``sacct``
where accounting exists, and otherwise from the ``exit`` lines the launcher writes to
each rank's log, with a message saying so. Every Slurm command goes through one runner.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from slurmtf.check import stragglers
from slurmtf.contracts import (
    DEFAULT_LOG_DIR,
    FINAL_STATES,
    SCRIPT_LOG_NAME,
    SUBMITIT_LOG_NAME,
    base_state,
    format_seconds,
    is_final,
    rank_log_paths,
)
from slurmtf.errors import SlurmCommandError
from slurmtf.events import Event, last, named, parse_events, read_events
from slurmtf.monitor import records as jobrecord
from slurmtf.monitor.console import Console, Renderer, render_lines, shown_stderr
from slurmtf.monitor.failure_cost import job_cost
from slurmtf.monitor.job_logs import (
    error_lines,
    final_accuracy,
    log_lines,
    logged_exit,
    read_new,
    recorded_status,
)
from slurmtf.monitor.records import JobPlace
from slurmtf.monitor.slurm_view import SlurmView, ask_slurm, job_records
from slurmtf.runtime.recovery.record import batch_side_lines, in_place, read_record
from slurmtf.slurm.controller import ControllerSilent, silence_of
from slurmtf.slurm.runner import Runner, default_runner
from slurmtf.slurm.sacct import accounting_states
from slurmtf.spec import noderange


def exit_status(state: str, exit_code: str) -> int:
    """A final Slurm state and ``ExitCode=N:S`` -> the status ``--wait`` exits with."""
    base = base_state(state)
    if base == "COMPLETED":
        return 0
    code, _, sig = exit_code.partition(":")
    if base == "FAILED" and code.isdigit() and int(code):
        return int(code)
    if sig.isdigit() and int(sig):
        return 128 + int(sig)
    return FINAL_STATES.get(base, 1)


def job_states(job_id: str, runner: Runner) -> list[tuple[str, str]] | None:
    """``[(state, exit_code), ...]`` (one per array task) or ``None`` when Slurm forgot it."""
    records = job_records(job_id, runner)
    if records is None:
        return None
    return [(r.get("JobState", "UNKNOWN"), r.get("ExitCode", "0:0")) for r in records]


def state_line(job_id: str, runner: Runner, folder: Path) -> tuple[str, int | None]:
    """One line about the job and, when it is over, its exit status."""
    states = job_states(job_id, runner)
    source = "scontrol"
    if states is None:
        states = accounting_states(job_id, runner, recorded_status(folder, job_id))
        source = "sacct"
    if states is None:
        status = logged_exit(rank_log_paths(folder, job_id, 1)[0])
        where = "from its rank 0 log" if status is not None else "unknown"
        return (
            f"job {job_id}: no longer known to Slurm and accounting is unavailable (sacct); "
            f"exit status {where}: {status if status is not None else '?'}. "
            f"HINT: see `slurmtf logs {job_id} --log_dir={folder}`",
            status,
        )
    text = ", ".join(f"{s} (exit {c})" for s, c in states)
    done = all(is_final(s) for s, _ in states)
    status = max((exit_status(s, c) for s, c in states), default=1) if done else None
    return f"job {job_id}: {text} [{source}]", status


def waiting_line(job_id: str, runner: Runner, folder: Path) -> tuple[str, int | None]:
    """:func:`state_line` for a follower: a controller that does not answer for a while (a
    failover, maintenance) is a line, and the wait goes on; no configuration is an error."""
    try:
        return state_line(job_id, runner, folder)
    except SlurmCommandError as exc:
        found = silence_of(exc)
        if found is None or found.no_config:
            raise
        return f"job {job_id}: Slurm did not answer ({found.words}); still waiting", None


def follow(
    job_id: str,
    folder: Path,
    num_tasks: int,
    *,
    runner: Runner = default_runner,
    out: TextIO = sys.stdout,
    poll_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
    log_job: str | None = None,
    verbose: bool = False,
    live: bool | None = None,
) -> int:
    """Show rank 0's log as a person reads it until the job ends; summarize; return its
    status.

    Events become human lines (:mod:`slurmtf.monitor.console`), progress one live line on a
    terminal (``live``: default, whether ``out`` is one); of rank 0's stderr only
    warnings and errors, everything with ``verbose``. ``log_job`` names the log files
    when they differ from ``job_id`` (``123_0`` for the first task of array ``123``).
    """
    log_job = log_job or job_id
    rank0 = rank_log_paths(folder, log_job, 1)[0]
    rank0_err = rank_log_paths(folder, log_job, 1, "err")[0]
    console, renderer = Console(out, live), Renderer()
    offsets = [0, 0]
    last_line = ""
    status: int | None = None
    seen_final = 0
    while True:
        line, status = waiting_line(job_id, runner, folder)
        if line != last_line:
            console.line(f"slurmtf: {line}")
            last_line = line
        new, offsets[0] = read_new(rank0, offsets[0])
        _show_stdout(new, console, renderer)
        new, offsets[1] = read_new(rank0_err, offsets[1])
        for text in new:
            if shown_stderr(text, verbose):
                console.line(text)
        # A final state must hold for two polls: a preempted or requeued job passes
        # through PREEMPTED on its way back to PENDING.
        seen_final = seen_final + 1 if status is not None else 0
        if status is not None and seen_final >= 2:
            break
        sleep(poll_s)
    console.close()
    cause = failed_rank(folder, log_job, num_tasks)
    if status >= 128 and cause is not None:
        # srun reports the highest task status: a rank stopped by --kill-on-bad-exit
        # (SIGTERM, 143) hides the rank that failed first; report that one.
        print(f"slurmtf: rank {cause[0]} failed with status {cause[1]}", file=out)
        status = cause[1]
    print(summary(log_job, folder, num_tasks, status), file=out, flush=True)
    return status


def _show_stdout(lines: list[str], console: Console, renderer: Renderer) -> None:
    """A rank's new stdout lines: events rendered (progress live), other lines as they are."""
    for text in lines:
        found = parse_events(text)
        if not found:
            console.line(text)
        elif found[0].get("event") == "progress":
            console.progress(renderer.line(found[0]))
        elif found[0].get("event") == "timing":
            continue  # every rank, every --timing_every s: `slurmtf logs` shows them
        else:
            console.line(renderer.line(found[0]))


def failed_rank(folder: Path, log_job: str, num_tasks: int) -> tuple[int, int] | None:
    """The first rank whose logged exit status is a plain failure (1-127), if any."""
    for rank, path in enumerate(rank_log_paths(folder, log_job, num_tasks)):
        status = logged_exit(path)
        if status is not None and 0 < status < 128:
            return rank, status
    return None


def summary(job_id: str, folder: Path, num_tasks: int, status: int) -> str:
    """The closing lines: status, final accuracy (chief's eval line), per-rank logs."""
    lines = [f"slurmtf: job {job_id} finished with exit status {status}"]
    chief = rank_log_paths(folder, job_id, 1)[0]
    acc = final_accuracy(chief)
    if acc is not None:
        # synthetic data is learnt to ~1.0: say so, lest it read as a real result
        synthetic = any(e.get("synthetic") for e in named(read_events(chief), "cluster"))
        on = " on SYNTHETIC data (benchmark input, not a real task)" if synthetic else ""
        lines.append(f"slurmtf: final accuracy {acc[0]:.4f} (step {acc[1]}){on}")
    lines.append("slurmtf: logs per rank:")
    for rank, (o, e) in enumerate(
        zip(
            rank_log_paths(folder, job_id, num_tasks),
            rank_log_paths(folder, job_id, num_tasks, "err"),
            strict=True,
        )
    ):
        lines.append(f"  rank {rank}: {o}  {e}")
    return "\n".join(lines)


def slurm_record(job_id: str, runner: Runner) -> dict[str, str] | None:
    """The job's (first) ``scontrol -o show job`` record, or ``None`` once Slurm forgot it."""
    records = job_records(job_id, runner)
    return records[0] if records else None


def locate(
    job_id: str, runner: Runner, log_dir: str | None = None, view: SlurmView | None = None
) -> JobPlace:
    """Where the job's logs are: ``--log_dir``, Slurm's record (``view``, else asked), the
    user's record, default."""
    if log_dir:
        folder = Path(log_dir).expanduser().absolute()
        script = JobPlace(job_id, folder, SCRIPT_LOG_NAME, "given")
        return script if script.ranks() else JobPlace(job_id, folder, SUBMITIT_LOG_NAME, "given")
    fields = (view or ask_slurm(job_id, runner)).record
    place = jobrecord.from_slurm(job_id, fields) if fields else None
    if place is not None and place.log_dir.is_dir():
        return place
    place = jobrecord.lookup(job_id)
    if place is not None:
        return place
    folder = Path(DEFAULT_LOG_DIR).absolute()
    return JobPlace(job_id, folder, SUBMITIT_LOG_NAME, "default")


def status_lines(
    job_id: str, runner: Runner, place: JobPlace, view: SlurmView | None = None
) -> list[str]:
    """State, restarts, progress (step/total, examples/s, ETA), the straggler (chief's
    ``straggler`` events, slurmtf.check.stragglers), what the failures cost
    (slurmtf.monitor.failure_cost), logs, last error. ``view``: Slurm's
    answer when already asked; a controller that did not answer is one line, the rest
    from the job's record and logs."""
    view = view or ask_slurm(job_id, runner)
    fields = view.record
    records = read_record(place.log_dir, job_id)  # restarts in place, requeues (the supervisor)
    chief_events = read_events(place.rank_log(0))
    starts = named(chief_events, "cluster")
    done = named(chief_events, "done")
    if fields is not None:
        state = (
            f"{fields.get('JobState', 'UNKNOWN')} (exit {fields.get('ExitCode', '?')}) [scontrol]"
        )
        restarts = str(int(fields.get("Restarts", "0") or 0) + in_place(records))
    elif view.silent is not None:
        state = silent_state(job_id, runner, place, view, done)
        restarts = str(max(len(starts) - 1, in_place(records)))
    elif done:
        how = "preempted" if done[-1].get("preempted") else "finished"
        state = f"no longer known to Slurm; rank 0 logged '{how}' at step {done[-1].get('step')}"
        restarts = str(max(len(starts) - 1, 0))
    else:
        state = state_line(job_id, runner, place.log_dir)[0].split(": ", 1)[1]
        restarts = str(max(len(starts) - 1, 0))
    lines = [f"job {job_id}: {state}, restarts {restarts}"]
    lines.extend([f"  {view.note()}"] if view.silent else [])
    lines.extend(shape_lines(fields, starts, runner))
    progress = last(chief_events, "progress")
    if progress is not None:
        step, total = progress.get("step"), progress.get("total")
        rate = progress.get("examples_per_sec")
        batch = starts[-1].get("global_batch") if starts else None
        eta = "?"
        if all(isinstance(v, int | float) for v in (step, total, rate, batch)) and rate:
            eta = format_seconds((float(total) - float(step)) * float(batch) / float(rate))  # type: ignore[arg-type]
        rate_text = f"{rate:.1f}" if isinstance(rate, int | float) else "?"
        lines.append(f"  step {step}/{total}, {rate_text} examples/s, ETA {eta} (rank 0's events)")
    elif chief_events:
        lines.append("  no training step logged yet")
    straggler = stragglers.status_line(chief_events)
    if straggler is not None:
        lines.append(f"  {straggler}")
    cost = job_cost(chief_events, records)
    if cost.failures:
        lines.append(f"  {cost.words()} (rank 0's events)")
    lines.extend(f"  {line}" for line in decision_lines(records))
    lines.extend(log_lines(place))
    lines.append(f"  tensorboard: slurmtf tensorboard {job_id} (prints the ssh line)")
    lines.extend(error_lines(place, records))
    return lines


def decision_lines(records: list[Event]) -> list[str]:
    """The record's last three decisions, and before them every one about the job's batch
    side (a lost batch host, the supervisor's own end) that they leave out."""
    last = [str(r["line"]) for r in records[-3:] if r.get("line")]
    return [*(line for line in batch_side_lines(records[:-3]) if line not in last), *last]


def silent_state(
    job_id: str, runner: Runner, place: JobPlace, view: SlurmView, done: list[Event]
) -> str:
    """The state when the controller did not answer: accounting's (slurmdbd, another
    daemon) unless this machine has no configuration, else the job's record and logs."""
    known = recorded_status(place.log_dir, job_id)
    no_config = view.silent is not None and view.silent.no_config
    states = None if no_config else accounting_states(job_id, runner, known)
    if states:
        return ", ".join(f"{s} (exit {c})" for s, c in states) + " [sacct]"
    where = "its recovery record"
    if known is None:
        known, where = logged_exit(place.rank_log(0)), "rank 0's log"
    ended = f"exit status {known} ({where})" if known is not None else "no exit status logged"
    if not done:
        return f"state unknown, {ended}"
    how = "preempted" if done[-1].get("preempted") else "finished"
    return f"rank 0 logged '{how}' at step {done[-1].get('step')}, {ended}"


def shape_lines(fields: dict[str, str] | None, starts: list[Event], runner: Runner) -> list[str]:
    """A worker count that changed over the restarts (a ``--nodes`` range), and why a
    pending job waits, naming the nodes that cannot run it."""
    lines = []
    workers = noderange.workers_line(starts)
    if workers:
        lines.append(f"  {workers}")
    if fields is not None and fields.get("JobState") == "PENDING":
        try:
            nodes = runner(["sinfo", "-h", "-N", "-o", "%N|%t|%E"], check=False)
        except SlurmCommandError:
            nodes = ""
        unavailable = noderange.parse_nodes_states(nodes)
        waits = noderange.pending_line(fields, unavailable)
        why = noderange.admin_line(fields.get("JobId", ""), fields, unavailable)
        lines.extend(line for line in (waits, why) if line)
    return lines


def follow_rank(
    job_id: str,
    path: Path,
    runner: Runner,
    *,
    out: TextIO = sys.stdout,
    poll_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
    raw: bool = False,
) -> int:
    """Print ``path`` as it grows until the job ends (a final state seen twice); events
    as human lines unless ``raw``."""
    offset, seen = 0, 0
    renderer = Renderer()

    def show() -> None:
        nonlocal offset
        lines, offset = read_new(path, offset)
        for text in lines if raw else render_lines(lines, renderer):
            out.write(text + "\n")
        out.flush()

    while True:
        show()
        try:
            fields = slurm_record(job_id, runner)
            state = fields.get("JobState", "") if fields else "gone"
        except SlurmCommandError as exc:  # a failover: follow on; no configuration: stop
            found = silence_of(exc)
            if found is None:
                raise
            if found.no_config:
                raise ControllerSilent(exc.command, exc.returncode, exc.stderr, found) from exc
            state = ""
        seen = seen + 1 if state == "gone" or is_final(state) else 0
        if seen >= 2:
            show()
            return 0
        sleep(poll_s)
