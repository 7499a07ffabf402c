"""When Slurm's controller does not answer: the one reading of a command's error, and a
brief retry for the commands that need the controller.

A client command that cannot reach ``slurmctld`` says so in Slurm's own words, the same
from 22.05 to 26.05 (``src/common/slurm_errno.c``, ``read_config.c``,
``slurm_protocol_api.c``):

* ``Unable to contact slurm controller (connect failure)``: nothing listens (stopped,
  down for maintenance, failing over). Slurm itself has already retried the connection
  for ``MessageTimeout`` seconds (10 by default); the request never left.
* ``... (send failure)``, ``(receive failure)``, ``(shutdown failure)``, ``Socket timed
  out on send/recv operation`` (a controller that accepts but never replies: hung,
  frozen), ``Zero Bytes were transmitted or received`` (it died mid-request): the
  request may have arrived.
* ``Could not establish a configuration source`` (no ``SLURM_CONF``, no
  ``/etc/slurm/slurm.conf``, no DNS SRV record for a configless cluster), ``Unable to
  establish controller machine|port``: this machine does not know where the controller
  is; asking again does not help.

:func:`silence` is the pure classifier (an error -> :class:`Silence` or ``None``);
:func:`patient` wraps a runner so that a command that needs the controller is retried
for a few seconds in all (never a request that may have arrived and is not safe to
repeat, never a missing configuration), then fails with :class:`ControllerSilent`,
which names what was asked.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from slurmtf.errors import SlurmCommandError
from slurmtf.slurm.runner import Runner

T = TypeVar("T")

RETRY_BUDGET_S = 5.0  # our own pauses and attempts, on top of Slurm's MessageTimeout
RETRY_PAUSES_S = (1.0, 2.0)  # between the attempts: three tries at most

# Slurm's words -> (no configuration here, the request may have reached the controller)
_WORDINGS: tuple[tuple[re.Pattern[str], bool, bool], ...] = (
    (re.compile(r"Unable to contact slurm controller \(connect failure\)"), False, False),
    (re.compile(r"Unable to contact slurm controller \((?:send|receive|shutdown) failure\)"),
     False, True),
    (re.compile(r"Socket timed out on send/recv operation"), False, True),
    (re.compile(r"Zero Bytes were transmitted or received"), False, True),
    (re.compile(r"Could not establish a configuration source"), True, False),
    (re.compile(r"Unable to establish controller (?:machine|port)"), True, False),
)  # fmt: skip

# Commands that only read, or whose repeat does no harm (a second scancel of a job).
_REPEATABLE = frozenset({"squeue", "sinfo", "sacct", "scancel", "sprio", "sshare", "sdiag"})
_SCONTROL_READS = frozenset({"show", "ping"})


@dataclass(frozen=True)
class Silence:
    """Why a Slurm command got no answer: Slurm's own words; whether this machine lacks
    the configuration (asking again will not help); whether the request may have
    reached the controller before it went silent (repeat only what is safe to)."""

    words: str
    no_config: bool
    maybe_arrived: bool

    def hint(self) -> str:
        if self.no_config:
            return (
                "this machine has no Slurm configuration: set SLURM_CONF to the cluster's "
                "slurm.conf, or run this on a login node of the cluster"
            )
        return (
            "slurmctld may be down for maintenance or failing over: `scontrol ping` says "
            "when it answers again; then run this again"
        )


def silence(stderr: str) -> Silence | None:
    """A Slurm command's stderr -> why the controller did not answer, or ``None`` when the
    command got an answer (an error of its own, e.g. an invalid job id). Slurm's words
    decide, not the exit status: a step that outlived the runner's timeout is no silence."""
    for pattern, no_config, maybe_arrived in _WORDINGS:
        found = pattern.search(stderr)
        if found:
            return Silence(found.group(0), no_config, maybe_arrived)
    return None


def silence_of(exc: SlurmCommandError) -> Silence | None:
    """:func:`silence` of a runner's error (``ControllerSilent`` keeps its own)."""
    if isinstance(exc, ControllerSilent):
        return exc.silence
    return silence(exc.stderr)


def repeatable(args: Sequence[str]) -> bool:
    """True for a command that may run twice: a query, or a cancel."""
    name = args[0].rsplit("/", 1)[-1] if args else ""
    if name == "scontrol":
        verbs = [a for a in args[1:] if not a.startswith("-")]
        return bool(verbs) and verbs[0] in _SCONTROL_READS
    return name in _REPEATABLE


class ControllerSilent(SlurmCommandError):
    """Slurm's controller did not answer a command; the message names the command, Slurm's
    words, the tries and a HINT."""

    def __init__(
        self, command: str, returncode: int, stderr: str, found: Silence, *, tries: int = 1,
        elapsed_s: float = 0.0, repeat_safe: bool = True,
    ) -> None:  # fmt: skip
        super().__init__(command, returncode, stderr)
        self.silence = found
        what = "found no Slurm configuration" if found.no_config else "got no answer from slurmctld"
        tried = f" ({tries} tries in {elapsed_s:.0f} s)" if tries > 1 else ""
        caution = (
            "; it may have reached Slurm before the controller went silent: see `squeue --me` "
            "before running it again"
            if found.maybe_arrived and not repeat_safe
            else ""
        )
        self.args = (
            f"command={command!r} {what}{tried}: {found.words}{caution}. HINT: {found.hint()}",
        )


def persist(
    call: Callable[[], T],
    args: Sequence[str],
    *,
    asked: str = "",
    budget_s: float = RETRY_BUDGET_S,
    pauses_s: Sequence[float] = RETRY_PAUSES_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``, which runs the Slurm command ``args``, again after each of ``pauses_s``
    while its controller does not answer and the whole stays within ``budget_s`` (a
    command that already waited Slurm's ``MessageTimeout`` is not tried again); never
    when the configuration is missing, nor when the request may have arrived and ``args``
    is not safe to repeat. Then :class:`ControllerSilent`, naming ``asked`` (default: the
    command). Other errors pass through unchanged."""
    start = clock()
    tries = 0
    while True:
        tries += 1
        try:
            return call()
        except SlurmCommandError as exc:
            found = silence_of(exc)
            if found is None:
                raise
            pause = pauses_s[tries - 1] if tries <= len(pauses_s) else None
            again = not found.no_config and (not found.maybe_arrived or repeatable(args))
            if not again or pause is None or clock() - start + pause > budget_s:
                raise ControllerSilent(
                    asked or exc.command, exc.returncode, exc.stderr, found,
                    tries=tries, elapsed_s=clock() - start, repeat_safe=repeatable(args),
                ) from exc  # fmt: skip
            sleep(pause)


def patient(
    runner: Runner,
    *,
    budget_s: float = RETRY_BUDGET_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Runner:
    """``runner`` for commands that need the controller: each command through
    :func:`persist`."""

    def run(
        args: Sequence[str],
        *,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        check: bool = True,
    ) -> str:
        def once() -> str:
            return runner(args, input=input, env=env, timeout=timeout, check=check)

        return persist(once, args, budget_s=budget_s, clock=clock, sleep=sleep)

    return run
