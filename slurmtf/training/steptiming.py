"""Each rank's compute and all-reduce wait per step, its links' rates, the chief's
straggler reports (:mod:`slurmtf.check.stragglers` decides; this module measures and speaks).

How it is measured, with no sync added to training:

* ``compute``: inside the compiled step, ``tf.timestamp()`` before the batch is taken
  and again once this replica's gradients are ready (input, forward, backward).
* ``step``: the step's wall time on the host (call to result). The ranks meet at every
  all-reduce, so ``wait = step - compute`` is the time this rank waited for its peers
  and their links (plus the update, which is the same everywhere).
* The rates of this rank's links: the kernel's own counters of every TCP socket the
  process holds to another node (``TCP_INFO``: bytes acknowledged, time with data in
  flight), read once per interval; no probe traffic.
* Its GPUs, where ``nvidia-smi`` answers (:mod:`.gpu_query`, asked once an interval,
  never waited on): their utilisation and memory, those of ``CUDA_VISIBLE_DEVICES``.
* Every replica writes ``[compute, its last step, GPU utilisation, GPU MiB used, GPU MiB
  in all, rate to node 0..M-1]`` into its own row of a small matrix that rides on the
  all-reduce the step already does for its loss (one collective, ``replicas x (5 + M)``
  floats more; the rates are left out above :data:`MAX_LINK_NODES` nodes). So every rank
  knows every rank's figures, and the chief can judge (and write each rank's GPUs into
  TensorBoard) without any message of its own.

Every ``--timing_every`` seconds each rank prints one ``timing`` event (its own means,
its links); the chief also runs the detector and prints ``straggler`` and
``straggler_recovered`` events and one log line each.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from absl import logging

from slurmtf import events
from slurmtf.check import stragglers
from slurmtf.training import gpu_query

MAX_LINK_NODES = 64
GPU_COLUMNS = 3  # a rank's GPUs in its row: utilisation %, MiB used, MiB in all
WARM_UP_STEPS = 2  # not timed
MIN_BYTES = 256 * 1024  # a link must have moved this much in an interval to be rated
_TCP_INFO_LEN = 232
_BYTES_ACKED = 120  # struct tcp_info offsets (linux/tcp.h, Linux >= 4.19)
# tcpi_busy_time: kept by the kernel in jiffies (1-4 ms) and reported in microseconds; a
# burst within one jiffy counts 0 or 1 of them, which averages out over an interval.
_BUSY_TIME = 168


Key = tuple[str, int, str, int]  # local address and port, peer address and port
Counters = tuple[str, int, int]  # peer node, bytes acknowledged, busy microseconds


def tcp_counters(node_of: Mapping[str, str]) -> dict[Key, Counters]:
    """This process's TCP sockets to the addresses in ``node_of``, with their counters."""
    found: dict[Key, Counters] = {}
    try:
        fds = list(Path("/proc/self/fd").iterdir())
    except OSError:
        return found
    for path in fds:
        try:
            if not str(path.readlink()).startswith("socket:"):
                continue
            copy = os.dup(int(path.name))
        except (OSError, ValueError):
            continue
        try:
            sock = socket.socket(fileno=copy)
        except OSError:
            os.close(copy)
            continue
        with sock:
            entry = _counters(sock, node_of)
        if entry is not None:
            found[entry[0]] = entry[1]
    return found


def _counters(sock: socket.socket, node_of: Mapping[str, str]) -> tuple[Key, Counters] | None:
    if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        peer, local = sock.getpeername(), sock.getsockname()
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except OSError:
        return None
    node = node_of.get(str(peer[0]).removeprefix("::ffff:"))
    if node is None or len(info) < _BUSY_TIME + 8:
        return None
    (acked,) = struct.unpack_from("Q", info, _BYTES_ACKED)
    (busy,) = struct.unpack_from("Q", info, _BUSY_TIME)
    return (str(local[0]), int(local[1]), str(peer[0]), int(peer[1])), (node, acked, busy)


class LinkMeter:
    """Send rate per peer node (Mbit/s while data was in flight) since the last call."""

    def __init__(self, node_of: Mapping[str, str]) -> None:
        self.node_of = dict(node_of)
        self._last: dict[Key, Counters] = {}

    def rates(self) -> dict[str, float]:
        now = tcp_counters(self.node_of)
        sent: dict[str, list[int]] = {}
        for key, (node, acked, busy) in now.items():
            _, acked0, busy0 = self._last.get(key, (node, 0, 0))
            total = sent.setdefault(node, [0, 0])
            total[0] += max(acked - acked0, 0)
            total[1] += max(busy - busy0, 0)
        self._last = now
        # bytes * 8 / microseconds = Mbit/s
        return {n: b * 8 / us for n, (b, us) in sent.items() if b >= MIN_BYTES and us > 0}


def node_addresses(workers: Sequence[str], nodes: Sequence[str], own: str) -> dict[str, str]:
    """IP address -> node of the other nodes' ranks; an address two nodes share (every
    node on one loopback) tells nothing and is left out."""
    found: dict[str, set[str]] = {}
    for worker, node in zip(workers, nodes, strict=False):
        host = worker.rsplit(":", 1)[0].strip("[]")
        try:
            address = socket.gethostbyname(host)
        except OSError:
            continue
        found.setdefault(address, set()).add(node)
    return {a: next(iter(n)) for a, n in found.items() if len(n) == 1 and own not in n}


class StepTiming:
    """Per-step figures of every rank, summed over an interval; the interval's events."""

    def __init__(
        self,
        *,
        every_s: float,
        window_s: float,
        rank: int,
        nodes: Sequence[str],
        replicas: int,
        is_chief: bool,
        meter: LinkMeter | None,
        gpu: gpu_query.GpuProbe | None = None,
        visible: str | None = None,
    ) -> None:
        """``gpu``: this node's GPUs, asked once an interval; ``visible``: this rank's
        ``CUDA_VISIBLE_DEVICES`` (which of them are its own)."""
        import numpy as np

        self.every_s = every_s
        self.rank = rank
        self.nodes = list(nodes) or ["localhost"]
        names = list(dict.fromkeys(self.nodes))
        self.link_nodes = names if len(names) <= MAX_LINK_NODES else []
        self.replicas = replicas
        self.per_rank = max(replicas // max(len(self.nodes), 1), 1)
        self.is_chief = is_chief
        self.meter = meter
        self.gpu, self.visible = gpu, visible
        self.tracker = stragglers.Tracker(window_s)
        self._extra = np.zeros(1 + GPU_COLUMNS + len(self.link_nodes), dtype=np.float32)
        self._sums = np.zeros((replicas, 2))
        self._steps = 0
        self._start = time.time()
        self._called = time.perf_counter()
        self._latest: Any = None
        self._warm_up = WARM_UP_STEPS
        # the chief's allocation summaries (slurmtf.training.allocation.Board.window)
        self.listener: Callable[..., None] | None = None

    @property
    def columns(self) -> int:
        return 2 + GPU_COLUMNS + len(self.link_nodes)

    def extra_input(self) -> Any:
        """The step's extra input: this rank's last step time, its GPUs and its link rates
        (node order).

        Called right before the step: the step's host time starts here."""
        self._called = time.perf_counter()
        return self._extra

    def add(self, flat: Any, step: int) -> None:
        """One step's reduced rows (``replicas x columns``, flattened); report when due."""
        self._extra[0] = time.perf_counter() - self._called
        if self._warm_up:  # the first step traces the step function, and the second
            self._warm_up -= 1  # carries the first's time: neither is a step's time
            self._start = time.time()
            return
        rows = flat.reshape(self.replicas, self.columns)
        self._sums += rows[:, :2]
        self._latest = rows
        self._steps += 1
        if self.every_s and time.time() - self._start >= self.every_s:
            self.report(step)

    def report(self, step: int) -> None:
        """The interval's ``timing`` event, and on the chief the straggler reports."""
        now = time.time()
        samples = self.samples()
        if self.meter is not None:
            rates = self.meter.rates()
            self._extra[1 + GPU_COLUMNS :] = [rates.get(n, 0.0) for n in self.link_nodes]
        if self.gpu is not None:
            mine = gpu_query.own(self.gpu.latest(), self.visible)
            figures = (
                (mine.utilization, mine.memory_used_mib, mine.memory_total_mib)
                if mine
                else (0.0,) * GPU_COLUMNS
            )
            self._extra[1 : 1 + GPU_COLUMNS] = figures
        own = samples[self.rank] if self.rank < len(samples) else None
        if own is not None:
            events.emit(
                "timing", rank=self.rank, node=own.node, step=step, steps=self._steps,
                compute_s=round(own.compute_s, 5), wait_s=round(own.wait_s, 5),
                links={n: round(r, 1) for n, r in own.links.items()}, time=round(now, 3),
            )  # fmt: skip
        if self.is_chief:
            reports = self.tracker.update(self._start, now, stragglers.find(samples))
            for found in reports:
                events.emit(found.event, **found.fields())
                logging.warning("%s", found.message())
            if self.listener is not None:
                self.listener(
                    step, samples, reports, seconds=now - self._start, steps=self._steps, now=now
                )
        self._sums[:] = 0
        self._steps = 0
        self._start = now

    def close(self) -> None:
        """Stop a ``nvidia-smi`` query still running."""
        if self.gpu is not None:
            self.gpu.close()

    def samples(self) -> list[stragglers.RankSample]:
        """One sample per rank (its first replica's row) over the interval so far."""
        out = []
        steps = max(self._steps, 1)
        for rank, node in enumerate(self.nodes):
            row = rank * self.per_rank
            if row >= self.replicas:
                break
            links: dict[str, float] = {}
            gpu = None
            if self._latest is not None:
                values = self._latest[row, 2 + GPU_COLUMNS :]
                links = {n: float(v) for n, v in zip(self.link_nodes, values, strict=True) if v > 0}
                util, used, total = (float(v) for v in self._latest[row, 2 : 2 + GPU_COLUMNS])
                gpu = (util, used, total) if total > 0 else None
            compute, step = (float(v) / steps for v in self._sums[row])
            wait = max(step - compute, 0.0)
            out.append(stragglers.RankSample(rank, node, compute, wait, links, gpu))
        return out


def from_layout(layout: Any, replicas: int, every_s: float, window_s: float) -> StepTiming:
    """The timing of this rank of ``layout`` (a :class:`slurmtf.cluster.layout.ClusterLayout`).

    Only the ranks that train count: a sidecar evaluator runs no step and holds no link
    of the all-reduce, so its node is neither timed nor blamed."""
    roles = layout.roles or ("worker",) * len(layout.nodes)
    training = [r for r, role in enumerate(roles) if role in ("chief", "worker")]
    nodes = [layout.nodes[r] for r in training]
    workers = [layout.workers[r] for r in training]
    rank = training.index(layout.task_index) if layout.task_index in training else 0
    own = nodes[rank] if rank < len(nodes) else ""
    meter = None
    if every_s and len(set(nodes)) > 1:
        meter = LinkMeter(node_addresses(workers, nodes, own))
    return StepTiming(
        every_s=every_s, window_s=window_s, rank=rank, nodes=nodes,
        replicas=replicas, is_chief=layout.is_chief, meter=meter,
        gpu=gpu_query.GpuProbe() if every_s else None,
        visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )  # fmt: skip
