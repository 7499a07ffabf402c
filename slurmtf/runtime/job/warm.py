"""Warm ranks: the next attempt's step, started while the current one trains.

A restart in place used to start a new srun step, a Python per rank and TensorFlow's
import (about 5 s of a 9 s restart on a 2-core node). With warm ranks
(``SLURMTF_WARM_STANDBY``) the supervisor starts the next attempt's step early, with
``srun --overlap`` on the same nodes and tasks, so that it shares the allocation's CPUs,
memory and GPUs with the step that trains. Its ranks import TensorFlow and Keras and wait
(:mod:`slurmtf.runtime.rank.standby`). When the step before ends and the decision is a
restart on the same nodes, the supervisor writes the go file and follows the warm step
as the new attempt; it is then no longer warm, and the next one starts after its first
step. When the next attempt runs elsewhere (a node left out), or the job ends, the
supervisor tells the warm ranks to go away.

``SLURMTF_WARM_STANDBY``: ``auto`` (the default) from the chief's first step once the
job has failed (its attempt is not the first), and after two minutes of an attempt
otherwise, so that a short job pays nothing; ``1`` from the chief's first step of every
attempt; ``0`` never. A script that reports no step (no ``trains`` event) is warmed 30 s
into its attempt at the earliest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from slurmtf.events import Event
from slurmtf.runtime.job.children import GRACE_S, Child
from slurmtf.runtime.rank.standby import BEAT_ENV, OF_ENV, STANDBY_ENV, remove_files, write_go

TRAINS = "trains"  # the chief's event after its first step of an attempt
START_AFTER_S = 30.0  # a step without that event (a user's script) is warmed after this
AUTO_AFTER_S = 120.0  # SLURMTF_WARM_STANDBY=auto: an attempt of a job that never failed
STOP_WAIT_S = 3.0  # a told rank exits within a poll; srun is ended after this


def go_path(log_dir: Path, job_id: str, attempt: int, *, moved: bool = False) -> Path:
    """The go file of ``attempt``'s warm ranks (``moved``: of those started on the
    placement without a node the beacon finds silent, apart from the others' word)."""
    return log_dir / f"standby-{job_id}.{attempt}{'-moved' if moved else ''}.json"


def standby_env(env: Mapping[str, str], go: Path, beat: Path, supervisor: int) -> dict[str, str]:
    """The warm step's environment: the attempt's, and where its ranks wait."""
    return {**env, STANDBY_ENV: str(go), BEAT_ENV: str(beat), OF_ENV: str(supervisor)}


def moved_step_name(attempt: int) -> str:
    """The srun step name of ``attempt``'s warm ranks started on the placement without a
    silent node: the end of the step that loses the node spares that step."""
    return f"slurmtf-standby-{attempt}"


def overlap_args(args: Sequence[str], name: str = "") -> list[str]:
    """The attempt's srun line, sharing the allocation with the step that trains
    (``--overlap``), its output appended to the ranks' logs (``name``: the step's)."""
    words = list(args)
    named = [f"--job-name={name}"] if name else []
    return [words[0], "--overlap", "--open-mode=append", *named, *words[1:]]


def trains(events: Iterable[Event]) -> bool:
    return any(e.get("event") == TRAINS for e in events)


def warm_delay(mode: str, *, failed: bool) -> float | None:
    """Seconds into an attempt before the next one's ranks start (``None``: never), for
    ``SLURMTF_WARM_STANDBY=mode`` in a job that has ``failed`` before or not."""
    if mode == "0":
        return None
    return 0.0 if mode == "1" or failed else AUTO_AFTER_S


def warm_now(delay: float, trained: bool, elapsed: float) -> bool:
    """Whether to start them now: ``delay`` passed and the chief has ``trained`` a step,
    or, for a script that reports no step, ``START_AFTER_S`` passed as well."""
    return elapsed >= delay and (trained or elapsed >= START_AFTER_S)


@dataclasses.dataclass
class Standby:
    """One warm step: the attempt it is for and the placement it runs with."""

    attempt: int
    place: tuple[str, ...]
    child: Child
    go: Path
    started: float = dataclasses.field(default_factory=time.monotonic)
    name: str = ""  # the step's name, when it has one of its own (moved_step_name)

    @classmethod
    def start(
        cls, attempt: int, place: Sequence[str], *, args: Sequence[str],
        env: Mapping[str, str], go: Path, stderr: Path | None, name: str = "",
    ) -> Standby:  # fmt: skip
        remove_files(go, side_files=False)  # an earlier job's word
        child = Child(overlap_args(args, name), env, stderr=stderr)
        return cls(attempt, tuple(place), child, go, name=name)

    def fits(self, attempt: int, place: Sequence[str]) -> bool:
        """Whether this step can be ``attempt``: alive, for it, on ``place``."""
        return self.child.poll() is None and attempt == self.attempt and tuple(place) == self.place

    def take_over(self, env: Mapping[str, str]) -> Child:
        """The go: the warm ranks start as the attempt, ``env`` set in theirs."""
        write_go(self.go, True, env)
        return self.child

    def stop(self, *, at_once: bool = False) -> int:
        """Tell the ranks to go away, and end the step if it is not gone by then
        (``at_once``: now; the told ranks leave by themselves, and a restart on other
        nodes does not wait for a step that may span a lost one). The ranks' start-up
        output goes too, unless the step had ended by itself (kept: ``<go
        file>.<rank>.err`` says why)."""
        ending = self.child.poll() is None
        if ending:
            with contextlib.suppress(OSError):
                write_go(self.go, False)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.child.proc.wait(timeout=0 if at_once else STOP_WAIT_S)
        status = self.child.stop(grace=0 if at_once else GRACE_S)
        if at_once and ending:  # the told ranks may not have read the word yet: it stays
            return status  # until the attempt it was for ends (Supervisor.run_step)
        remove_files(self.go, side_files=ending)
        return status

    def age(self) -> float:
        return time.monotonic() - self.started
