"""Whether a job's chief still runs, by its port: the one watch that the servers of a
ParameterServerStrategy job (:mod:`slurmtf.serve`) and the sidecar evaluator
(:mod:`slurmtf.training.sidecar`) share.

A chief counts as started once its port accepts a connection, and as gone once it then
refuses :data:`MISSES` probes in a row (one refused connect may be a blip). A chief
that never answers within the start timeout is an error (:class:`ChiefNeverStarted`):
each caller adds the fix that fits its users. One probe per look: bounded, no threads.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from slurmtf.errors import SlurmtfError

START_TIMEOUT_S = 600.0
POLL_S = 1.0
# Misses in a row before the chief counts as gone: one refused connect may be a blip.
MISSES = 2


@dataclass(frozen=True)
class Chief:
    """Where the chief listens."""

    host: str
    port: int

    @classmethod
    def at(cls, address: str) -> Chief:
        """``host:port`` (a TF_CONFIG cluster entry) -> the chief there."""
        host, _, port = address.rpartition(":")
        return cls(host, int(port))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


class ChiefNeverStarted(SlurmtfError):
    """The chief did not answer within the start timeout."""

    def __init__(self, chief: Chief, start_timeout: float) -> None:
        self.chief = chief
        self.start_timeout = start_timeout
        super().__init__(f"the chief at {chief} did not answer within {start_timeout:g} s")


def answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when something accepts a TCP connection on ``host:port`` right now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class ChiefWatch:
    """Whether the chief still runs; one probe of its port per :meth:`gone`."""

    def __init__(
        self,
        chief: Chief,
        start_timeout: float = START_TIMEOUT_S,
        *,
        probe: Callable[[str, int], bool] = answers,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.chief = chief
        self.start_timeout = start_timeout
        self._probe = probe
        self._clock = clock
        self._deadline = clock() + start_timeout
        self.seen = False
        self._misses = 0

    def gone(self) -> bool:
        """True once the chief answered and then missed :data:`MISSES` probes in a row;
        :class:`ChiefNeverStarted` when it never answered within the start timeout."""
        if self._probe(self.chief.host, self.chief.port):
            self.seen, self._misses = True, 0
            return False
        if self.seen:
            self._misses += 1
            return self._misses >= MISSES
        if self._clock() >= self._deadline:
            raise ChiefNeverStarted(self.chief, self.start_timeout)
        return False
