"""What a person reads: event lines as text, and one live progress line on a terminal.

:class:`Renderer` turns the events of :mod:`slurmtf.events` into short human lines (the
raw JSON stays in the rank files and ``slurmtf logs --json``); it remembers the global
batch of the ``cluster`` event for the ETA. :class:`Console` writes them: on a terminal
``progress`` lines replace each other in place (one live line, kept as the last progress
when the job ends), elsewhere every line is a plain line. :func:`shown_stderr` is the
filter for a rank's stderr while following a job: slurmtf's warnings and errors, not
TensorFlow's informational chatter (``--verbose`` shows everything).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, TextIO

from slurmtf.check import stragglers
from slurmtf.contracts import format_seconds, is_error_line
from slurmtf.events import Event, parse_events


def _ms(seconds: Any) -> Any:
    return seconds * 1e3 if isinstance(seconds, int | float) else None


def _num(value: Any, fmt: str = ".4f") -> str:
    return format(value, fmt) if isinstance(value, int | float) else "?"


class Renderer:
    """Events -> human lines; keeps what later lines need (the global batch)."""

    def __init__(self) -> None:
        self.global_batch: int | None = None

    def line(self, event: Event) -> str:
        name = str(event.get("event", "?"))
        render = getattr(self, f"_{name}", None)
        if render is None:
            fields = ", ".join(f"{k}={v}" for k, v in event.items() if k not in ("event", "time"))
            return f"{name}: {fields}" if fields else name
        text: str = render(event)
        return text

    def _progress(self, e: Event) -> str:
        step, total, rate = e.get("step"), e.get("total"), e.get("examples_per_sec")
        eta = "?"
        nums = (step, total, rate, self.global_batch)
        if all(isinstance(v, int | float) for v in nums) and rate:
            eta = format_seconds((float(total) - float(step)) * float(self.global_batch) / rate)  # type: ignore[arg-type]
        return (
            f"step {step}/{total}  loss {_num(e.get('loss'))}  accuracy {_num(e.get('accuracy'))}"
            f"  {_num(rate, '.1f')} examples/s  ETA {eta}"
        )

    def _cluster(self, e: Event) -> str:
        batch = e.get("global_batch")
        self.global_batch = batch if isinstance(batch, int) else self.global_batch
        workers = e.get("workers") or []
        shown = ", ".join(workers[:4]) + (f", ... ({len(workers)})" if len(workers) > 4 else "")
        restart = f", restart {e['restart_count']}" if e.get("restart_count") else ""
        data = ", SYNTHETIC data" if e.get("synthetic") else ""
        return (
            f"rank {e.get('rank')}: {e.get('num_workers')} worker(s) [{shown}], "
            f"{e.get('strategy')} ({e.get('collective')}), {e.get('replicas')} replica(s), "
            f"global batch {batch} ({e.get('per_replica_batch')} per replica), "
            f"{e.get('dtype')}{data}{restart}"
        )

    def _checkpoint(self, e: Event) -> str:
        how = ", written in the background" if e.get("asynchronous") else ""
        return f"checkpoint at step {e.get('step')}: {_num(e.get('seconds'), '.3f')} s{how}"

    def _eval(self, e: Event) -> str:
        epoch = e.get("epoch")
        at = f" (epoch {epoch:.1f})" if isinstance(epoch, int | float) else ""
        return (
            f"eval at step {e.get('step')}{at}: loss {_num(e.get('loss'))}, "
            f"accuracy {_num(e.get('accuracy'))} on {e.get('examples')} examples"
        )

    def _done(self, e: Event) -> str:
        how = "preempted, checkpoint saved," if e.get("preempted") else "done"
        resumed = f" (resumed at {e['start_step']})" if e.get("start_step") else ""
        loss = f", loss {_num(e.get('first_loss'))} -> {_num(e.get('last_loss'))}"
        return f"rank {e.get('rank')}: {how} at step {e.get('step')}{resumed}{loss}"

    def _launch(self, e: Event) -> str:
        params = e.get("params") or {}
        given = " with " + " ".join(f"{k}={v}" for k, v in params.items()) if params else ""
        restart = f" (restart {e['restart_count']})" if e.get("restart_count") else ""
        return f"rank {e.get('rank')} started on {e.get('node') or '?'}{restart}{given}"

    def _placement(self, e: Event) -> str:
        return (
            f"rank {e.get('rank')} on {e.get('node')}: CUDA_VISIBLE_DEVICES="
            f"{e.get('cuda_visible_devices')} ({e.get('gpu_plan')})"
        )

    def _exit(self, e: Event) -> str:
        return f"rank {e.get('rank')} exited with status {e.get('status')}"

    def _signal(self, e: Event) -> str:
        return f"rank {e.get('rank')} received {e.get('signal')}"

    def _requeue(self, e: Event) -> str:
        if e.get("done"):
            return f"requeued job {e.get('job_id')} (restart {e.get('next_restart_count')})"
        return f"not requeued: {e.get('reason')}"

    def _stalled(self, e: Event) -> str:
        return f"stalled: {e.get('message')}"

    def _timing(self, e: Event) -> str:
        links = e.get("links") or {}
        rates = ", ".join(f"{n} {_num(r, '.0f')} Mbit/s" for n, r in links.items())
        return (
            f"rank {e.get('rank')} ({e.get('node')}) at step {e.get('step')}: compute "
            f"{_num(_ms(e.get('compute_s')), '.0f')} ms, wait {_num(_ms(e.get('wait_s')), '.0f')}"
            f" ms a step{'; sends to ' + rates if rates else ''}"
        )

    def _straggler(self, e: Event) -> str:
        return stragglers.status_line([e]) or "straggler: ?"

    def _straggler_recovered(self, e: Event) -> str:
        return stragglers.status_line([e]) or "straggler recovered: ?"

    def _preempted(self, e: Event) -> str:
        return f"rank {e.get('rank')}: preempted at epoch {e.get('epoch')}, batch {e.get('batch')}"


def render_lines(lines: Iterable[str], renderer: Renderer | None = None) -> list[str]:
    """A rank's stdout for a person: each event as a human line, other lines as they are."""
    renderer = renderer or Renderer()
    out = []
    for raw in lines:
        found = parse_events(raw)
        out.append(renderer.line(found[0]) if found else raw.rstrip("\n"))
    return out


# slurmtf's log lines (`HH:MM:SS rankN W ...`) at warning level and up, TensorFlow's
# error-level lines (`E0000 ...`); and every error line (contracts.is_error_line).
_SHOWN = re.compile(r"^\d\d:\d\d:\d\d rank\d+ [WEF] |^[EF]\d{4} ")


def shown_stderr(line: str, verbose: bool = False) -> bool:
    """Whether a rank's stderr line is shown while following (all of them if ``verbose``).

    Informational lines are left out: the progress they repeat comes from the events,
    and TensorFlow's (``I0000 ...``, ``Sharding callback duration``) are for debugging.
    """
    return verbose or bool(_SHOWN.search(line)) or is_error_line(line)


class Console:
    """Lines to ``out``; on a terminal (``live``) progress lines replace each other."""

    def __init__(self, out: TextIO, live: bool | None = None) -> None:
        self.out = out
        self.live = _is_terminal(out) if live is None else live
        self._current = ""

    def line(self, text: str) -> None:
        if self._current:
            self.out.write("\r\x1b[K")
        self.out.write(text + "\n")
        if self._current:
            self.out.write(self._current)
        self.out.flush()

    def progress(self, text: str) -> None:
        if not self.live:
            self.line(text)
            return
        self._current = text
        self.out.write("\r\x1b[K" + text)
        self.out.flush()

    def close(self) -> None:
        """End the live line (it stays, as the last progress)."""
        if self._current:
            self.out.write("\n")
            self.out.flush()
            self._current = ""


def _is_terminal(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False
