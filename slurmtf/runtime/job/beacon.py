"""The nodes' beacon: a word a second from every node of the job, so that a node gone
silent is known lost without waiting on a probe.

When the ranks lose a peer, the supervisor must tell a hung or dead node from a rank
that died on a healthy one. The probe (``srun --overlap ... true``) tells them apart, but
a silent node makes it wait its whole timeout (``SLURMTF_NODE_PROBE_S``, 10 s) before
the next step can start. The beacon is one ``srun --overlap`` step beside the step that
trains, one task per node, each printing its node's name every :data:`BEAT_S` seconds;
a thread of the supervisor notes when each node last spoke.

A node the ranks lost is silent, and left out at once, when the beacon runs, it heard
the node before, the node has not spoken for :data:`SILENT_S` seconds, and another node
spoke meanwhile (so a stalled srun or batch host reads as no verdict, not as every node
lost). A node that speaks again is probed as before: its step daemon lives, but its
slurmd may not. A node the beacon never heard is probed as before too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from slurmtf.runtime.job.children import Child
from slurmtf.runtime.slurm_calls import BEACON_NAME, per_node_step

BEAT_S = 1.0  # between two words of a node
SILENT_S = 3.0  # without a word: a node the ranks lost is silent
POLL_S = 0.1  # while waiting for a node's next word


@dataclasses.dataclass
class Heard:
    """When each node last spoke (a monotonic clock)."""

    last: dict[str, float] = dataclasses.field(default_factory=dict)

    def note(self, line: str, at: float) -> None:
        node = line.strip()
        if node:
            self.last[node] = at

    def verdict(self, node: str, now: float, silent_s: float = SILENT_S) -> bool | None:
        """True: ``node`` is silent (heard before, not for ``silent_s`` s, while another
        node still speaks); False: it spoke within ``silent_s`` s; None: no verdict (never
        heard, or no node speaks, as when the beacon's srun itself stalls)."""
        last = self.last.get(node)
        if last is None:
            return None
        if now - last < silent_s:
            return False
        speaking = any(now - t < silent_s for n, t in self.last.items() if n != node)
        return True if speaking else None


def beacon_args(nodes: Sequence[str]) -> list[str]:
    """srun's arguments: one task on each of ``nodes``, sharing the allocation with the
    job's other steps (``--overlap``), each printing its node's name every second."""
    script = f'while :; do echo "$SLURMD_NODENAME"; sleep {BEAT_S:g}; done'
    return [
        *per_node_step(len(nodes)), "--overlap", f"--nodelist={','.join(nodes)}",
        f"--job-name={BEACON_NAME}", "--input=none", "sh", "-c", script,
    ]  # fmt: skip


class Beacon:
    """The beacon's step and the thread that reads it."""

    def __init__(
        self,
        nodes: Sequence[str],
        env: Mapping[str, str],
        clock: Callable[[], float] = time.monotonic,
        silent_s: float = SILENT_S,
    ) -> None:
        self.nodes = tuple(nodes)
        self.silent_s = silent_s
        self.heard = Heard()
        self.clock = clock
        self.lock = threading.Lock()
        self.child = Child(
            beacon_args(self.nodes), env, stdout=subprocess.PIPE, stderr=Path("/dev/null")
        )
        self.reader = threading.Thread(target=self._read, name="slurmtf-beacon", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        out = self.child.proc.stdout
        assert out is not None
        with contextlib.suppress(OSError, ValueError):
            for raw in out:
                with self.lock:
                    self.heard.note(raw.decode(errors="replace"), self.clock())

    def silent(
        self, nodes: Sequence[str], sleep: Callable[[float], None] = time.sleep
    ) -> tuple[str, ...]:
        """Those of ``nodes`` the beacon finds silent, after at most ``silent_s`` seconds
        (:data:`SILENT_S`): a node that spoke recently is given until then to speak again."""
        asked = self.clock()
        pending = [n for n in nodes if n in self.nodes]
        found: list[str] = []
        while pending and self.child.poll() is None:
            with self.lock:
                verdicts = {n: self._verdict(n, asked) for n in pending}
            found += [n for n, v in verdicts.items() if v is True]
            pending = [n for n, v in verdicts.items() if v == "wait"]
            if pending:
                sleep(POLL_S)
        return tuple(n for n in nodes if n in found)

    def _verdict(self, node: str, asked: float) -> bool | str | None:
        """As :meth:`Heard.verdict`, with ``"wait"`` for a node that spoke within
        ``silent_s`` s but not since it was asked about."""
        said = self.heard.verdict(node, self.clock(), self.silent_s)
        if said is False and self.heard.last[node] < asked:
            return "wait"
        return said

    def quiet(self) -> tuple[str, ...]:
        """The beacon's nodes that are silent now, without waiting (:meth:`Heard.verdict`);
        none once its srun ended."""
        if self.child.poll() is not None:
            return ()
        now = self.clock()
        with self.lock:
            return tuple(n for n in self.nodes if self.heard.verdict(n, now, self.silent_s))

    def silences(self, nodes: Sequence[str]) -> str:
        """How long each of ``nodes`` the beacon heard has been silent, for the job's
        log (e.g. ``node2 silent for 9.8 s``); "" when it heard none of them."""
        now = self.clock()
        with self.lock:
            heard = [(n, now - self.heard.last[n]) for n in nodes if n in self.heard.last]
        return ", ".join(f"{n} silent for {s:.1f} s" for n, s in heard)

    def stop(self, *, at_once: bool = False) -> None:
        """End the beacon's srun: SIGTERM, which it forwards to its tasks, and SIGKILL
        after 2 s (``at_once``: SIGKILL now, when its step was cancelled already: an srun
        whose step spans a silent node would wait for it)."""
        self.child.stop(grace=0 if at_once else 2)
        self.reader.join(timeout=2)  # srun gone: its pipe ends
        if not self.reader.is_alive() and self.child.proc.stdout is not None:
            self.child.proc.stdout.close()
