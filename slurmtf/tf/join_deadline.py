"""A bound on joining the peers where TensorFlow has none (releases before 2.19).

From 2.19 the coordination service makes every task wait at registration for all the
others, bounded by ``--registration_timeout`` (``cluster_register_with_barrier``). Older
releases bound only a joining task's own call to the leader: the leader, once
registered, waits more than ten minutes for a peer that never starts, and it waits in C++
holding Python's GIL, so no Python thread of the process can run meanwhile.

:class:`JoinDeadline` is the nearest equivalent, built to work without the GIL: a small
reporter process (``python -m slurmtf.tf.join_deadline``), started before the
strategy joins, waits out the bound, names the peers whose ports do not answer and reports
them as the barrier's error would (a ``peer_lost`` event on the rank's stdout, one line on
its stderr); a moment later :mod:`faulthandler`'s C timer ends the rank with exit status 1.
Joining in time cancels both. :func:`slurmtf.tf.coordination.configure` says when a
release needs it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from slurmtf import events

# The class that handles a release difference (docs/TENSORFLOW_VERSIONS.md's table).
RELEASE_DIFFERENCES = ("JoinDeadline",)

# TensorFlow's own bound on a joining task comes first when both apply.
GRACE_S = 5.0
# Between the reporter's lines and the end of the rank.
REPORT_S = 3.0
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


def message(program: str, timeout: float, missing: Sequence[int], peers: Mapping[int, str]) -> str:
    """The one line a rank prints when its peers did not all join in time."""
    who = describe(missing, peers) or "none found (every peer's port answers)"
    return (
        f"{program}: the peers did not all join within --registration_timeout={timeout:g} s"
        f" - missing {who}. HINT: read the missing ranks' logs (did they start? their node "
        "may be down); rerun (or requeue) to resume from the last checkpoint; raise "
        "--registration_timeout if ranks start slowly"
    )


def report(
    rank: int,
    peers: Mapping[int, str],
    timeout: float,
    program: str,
    probe: Callable[[str], bool] = answers,
) -> list[int]:
    """The barrier's error as :func:`slurmtf.training.app.report_lost_peers` reports it: a
    ``peer_lost`` event and one line on stderr. Returns the missing ranks."""
    missing = missing_peers(peers, probe)
    lost = [{"rank": r, "node": peers[r].rsplit(":", 1)[0]} for r in missing]
    events.emit("peer_lost", rank=rank, lost=lost, heartbeat=False)
    print(message(program, timeout, missing, peers), file=sys.stderr, flush=True)
    return missing


class JoinDeadline:
    """Ends this process when its peers have not joined within ``timeout`` seconds."""

    def __init__(
        self, *, rank: int, peers: Mapping[int, str], timeout: float, program: str = "slurmtf"
    ) -> None:
        self.rank = rank
        self.peers = dict(peers)  # the other ranks that must join: rank -> host:port
        self.timeout = timeout
        self.program = program
        self._reporter: subprocess.Popen[bytes] | None = None
        self._sink: IO[str] | None = None

    @property
    def reporter_args(self) -> list[str]:
        peers = json.dumps({str(r): a for r, a in self.peers.items()})
        wait = f"{self.timeout + GRACE_S:g}"
        return [sys.executable, "-m", __name__, str(self.rank), peers, f"{self.timeout:g}",
                self.program, wait, str(os.getpid())]  # fmt: skip

    def start(self) -> JoinDeadline:
        # The traceback faulthandler writes is no news to the user: the reporter's line is.
        self._sink = Path(os.devnull).open("w")  # noqa: SIM115 (kept open for faulthandler)
        self._reporter = subprocess.Popen(self.reporter_args)
        faulthandler.dump_traceback_later(
            self.timeout + GRACE_S + REPORT_S, exit=True, file=self._sink
        )
        return self

    def joined(self) -> None:
        """The strategy has joined its peers (or failed by itself): no bound any more."""
        faulthandler.cancel_dump_traceback_later()
        if self._reporter is not None:
            with contextlib.suppress(OSError):
                self._reporter.kill()
            self._reporter.wait()
            self._reporter = None
        if self._sink is not None:
            self._sink.close()
            self._sink = None


def main(argv: Sequence[str] | None = None) -> int:
    """The reporter: ``RANK PEERS_JSON TIMEOUT PROGRAM WAIT PARENT`` (started by
    :class:`JoinDeadline`). Says nothing when its rank ended first (another attempt's
    log must not get this one's line)."""
    rank, peers, timeout, program, wait, parent = sys.argv[1:] if argv is None else argv
    deadline = time.monotonic() + float(wait)
    while time.monotonic() < deadline:
        if os.getppid() != int(parent):
            return 0
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    if os.getppid() != int(parent):
        return 0
    mapping = {int(r): a for r, a in json.loads(peers).items()}
    report(int(rank), mapping, float(timeout), program)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
