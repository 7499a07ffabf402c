"""A bound on joining the peers where TensorFlow has none (releases before 2.19).

From 2.19 the coordination service makes every task wait at registration for all the
others, bounded by ``--registration_timeout`` (``cluster_register_with_barrier``). Older
releases bound only a joining task's own call to the leader: the leader, once
registered, waits more than ten minutes for a peer that never starts. :class:`JoinDeadline`
is the nearest equivalent: one thread, started before the strategy joins its peers and
stopped when it has; when the bound passes first, it names the peers whose ports do not
answer, reports them as the barrier's error would (a ``peer_lost`` event and one line) and
ends the process, whose main thread is blocked inside TensorFlow.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable, Mapping, Sequence

from slurmtf import events
from slurmtf.contracts import EXIT_FAILURE

# TensorFlow's own bound on a joining task comes first when both apply.
GRACE_S = 5.0
PROBE_TIMEOUT_S = 1.0


def answers(address: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether something listens at ``host:port`` (a peer's TensorFlow server)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def missing_peers(peers: Mapping[int, str], probe: Callable[[str], bool] = answers) -> list[int]:
    """The ranks among ``peers`` (rank -> ``host:port``) whose server does not answer."""
    return [rank for rank, address in sorted(peers.items()) if not probe(address)]


def describe(ranks: Sequence[int], peers: Mapping[int, str]) -> str:
    return ", ".join(f"rank {r} ({peers[r]})" for r in ranks)


class JoinDeadline:
    """Ends the process when the peers have not joined within ``timeout`` seconds."""

    def __init__(
        self,
        *,
        rank: int,
        peers: Mapping[int, str],
        timeout: float,
        program: str = "slurmtf",
        on_expiry: Callable[[str, list[int]], None] | None = None,
        probe: Callable[[str], bool] = answers,
    ) -> None:
        self.rank = rank
        self.peers = dict(peers)  # the other ranks that must join: rank -> host:port
        self.timeout = timeout
        self.program = program
        self._on_expiry = on_expiry or self._fail_process
        self._probe = probe
        self._joined = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> JoinDeadline:
        self._thread = threading.Thread(target=self._wait, name="slurmtf-join", daemon=True)
        self._thread.start()
        return self

    def joined(self) -> None:
        """The strategy has joined its peers (or failed by itself): no bound any more."""
        self._joined.set()
        if self._thread is not None:
            self._thread.join(timeout=PROBE_TIMEOUT_S * (len(self.peers) + 1))
            self._thread = None

    def message(self, missing: Sequence[int]) -> str:
        who = describe(missing, self.peers) or "none found (every peer's port answers)"
        return (
            f"{self.program}: the peers did not all join within --registration_timeout="
            f"{self.timeout:g} s - missing {who}. HINT: read the missing ranks' logs (did "
            "they start? their node may be down); rerun (or requeue) to resume from the "
            "last checkpoint; raise --registration_timeout if ranks start slowly"
        )

    def _fail_process(self, message: str, missing: list[int]) -> None:
        """The barrier's error as :func:`slurmtf.training.app.report_lost_peers` reports
        it (a ``peer_lost`` event), one line on stderr, and the end of the process."""
        lost = [{"rank": r, "node": self.peers[r].rsplit(":", 1)[0]} for r in missing]
        events.emit("peer_lost", rank=self.rank, lost=lost, heartbeat=False)
        print(message, file=sys.stderr, flush=True)
        os._exit(EXIT_FAILURE)

    def _wait(self) -> None:
        if self._joined.wait(self.timeout + GRACE_S):
            return
        missing = missing_peers(self.peers, self._probe)
        if not self._joined.is_set():
            self._on_expiry(self.message(missing), missing)
