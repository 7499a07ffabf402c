"""Plain TCP between the ranks of a check step: an all-gather through rank 0 (which is
also the barrier) and timed one-way streams, for link bandwidth without TensorFlow.

Every rank listens on its own worker port (``layout.workers[r]``) before TensorFlow
binds it; :meth:`Mesh.close` frees it again. A stream's rate is measured where it
arrives (bytes over first-to-last-byte time), so send buffers do not inflate it.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Sequence
from typing import Any

from slurmtf.errors import SlurmtfError

_HEADER = struct.Struct("!cII")  # kind (b"G" gather, b"D" data), source rank, sequence
_LEN = struct.Struct("!I")
_CHUNK = 1 << 18


class MeshError(SlurmtfError, RuntimeError):
    """A peer of the check step could not be reached or did not answer in time."""


def _split(worker: str) -> tuple[str, int]:
    host, _, port = worker.rpartition(":")
    return host, int(port)


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        data += chunk
    return bytes(data)


class Mesh:
    """Rank ``rank`` of ``workers`` (``host:port`` each): listen, gather, stream."""

    def __init__(self, rank: int, workers: Sequence[str], timeout: float = 120.0) -> None:
        self.rank, self.workers, self.timeout = rank, list(workers), timeout
        # Every other rank connects to rank 0 at once for each all-gather: a backlog of
        # the default 128 dropped ~690 connects (TcpExtListenOverflows) in 3 all-gathers of
        # 1,024 ranks, each a 1 s retransmit (docs/BENCHMARKS.md, "slurmtf check").
        self._server = socket.create_server(("", _split(workers[rank])[1]), backlog=len(workers))
        self._server.settimeout(0.5)
        self._cond = threading.Condition()
        self._gathered: dict[int, dict[int, tuple[socket.socket, Any]]] = {}
        self.received: dict[int, tuple[int, float]] = {}  # sequence -> (source, bits/s)
        self._seq = 0
        self._closed = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    # ---- serving --------------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(self.timeout)
        kind, src, seq = _HEADER.unpack(_recv_exact(conn, _HEADER.size))
        if kind == b"G":
            (size,) = _LEN.unpack(_recv_exact(conn, _LEN.size))
            payload = json.loads(_recv_exact(conn, size))
            with self._cond:
                self._gathered.setdefault(seq, {})[src] = (conn, payload)
                self._cond.notify_all()
            return
        total, first, last = 0, 0.0, 0.0
        with conn:
            while chunk := conn.recv(1 << 20):
                last = time.monotonic()
                if not total:
                    first = last
                total += len(chunk)
        rate = total * 8 / max(last - first, 1e-6) if total else 0.0
        with self._cond:
            self.received[seq] = (src, rate)
            self._cond.notify_all()

    # ---- all-gather (and barrier) ------------------------------------------------------------
    def allgather(self, payload: Any) -> list[Any]:
        """Every rank's ``payload``, in rank order, on every rank."""
        seq, self._seq = self._seq, self._seq + 1
        if self.rank != 0:
            with self._connect(0, b"G", seq) as conn:
                body = json.dumps(payload).encode()
                conn.sendall(_LEN.pack(len(body)) + body)
                (size,) = _LEN.unpack(_recv_exact(conn, _LEN.size))
                return list(json.loads(_recv_exact(conn, size)))
        n = len(self.workers)
        with self._cond:
            ready = self._cond.wait_for(
                lambda: len(self._gathered.get(seq, {})) == n - 1, self.timeout
            )
            peers = self._gathered.pop(seq, {})
        if not ready:
            missing = sorted(set(range(1, n)) - set(peers))
            raise MeshError(f"ranks {missing} did not reach the check's barrier "
                            f"in {self.timeout:.0f}s")  # fmt: skip
        everything = [payload, *(peers[r][1] for r in range(1, n))]
        body = json.dumps(everything).encode()
        for conn, _ in peers.values():
            with conn:
                conn.sendall(_LEN.pack(len(body)) + body)
        return everything

    def _connect(self, dst: int, kind: bytes, seq: int) -> socket.socket:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                conn = socket.create_connection(_split(self.workers[dst]), timeout=self.timeout)
                break
            except OSError as exc:  # the peer may not listen yet
                if time.monotonic() > deadline:
                    raise MeshError(f"rank {dst} ({self.workers[dst]}): {exc}") from exc
                time.sleep(0.1)
        conn.sendall(_HEADER.pack(kind, self.rank, seq))
        return conn

    # ---- streams ---------------------------------------------------------------------------
    def stream_round(self, shift: int, seconds: float) -> tuple[int, float]:
        """Send to rank ``rank+shift`` for ``seconds`` while rank ``rank-shift`` sends here;
        return (source, bits/s) of what arrived."""
        n = len(self.workers)
        self.allgather(None)  # everyone starts together
        seq = 1_000_000 + shift
        buf = memoryview(bytes(_CHUNK))
        with self._connect((self.rank + shift) % n, b"D", seq) as conn:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                conn.sendall(buf)
            conn.shutdown(socket.SHUT_WR)
        with self._cond:
            if not self._cond.wait_for(lambda: seq in self.received, self.timeout):
                raise MeshError(f"no stream arrived from rank {(self.rank - shift) % n}")
            return self.received[seq]

    def close(self) -> None:
        self._closed = True
        self._server.close()
        self._thread.join(timeout=2)


def link_rates(mesh: Mesh, rounds: int, seconds: float) -> dict[int, dict[int, float]]:
    """``rates[src][dst]`` (bits/s) from ``rounds`` shifts (1..n-1), on every rank."""
    n = len(mesh.workers)
    mine = [mesh.stream_round(k, seconds) for k in range(1, min(rounds, n - 1) + 1)]
    rates: dict[int, dict[int, float]] = {}
    for dst, got in enumerate(mesh.allgather(mine)):
        for src, bps in got:
            rates.setdefault(int(src), {})[dst] = float(bps)
    return rates
