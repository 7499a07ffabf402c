"""A stand-in rank: a light process that speaks the ranks' event protocol and nothing else.

Run as the user's script of the real job script, so that the launcher, the job script
and the supervisor are the ones users run, without TensorFlow's 500 MB and seconds of
start-up per rank::

    sbatch -N16 --ntasks-per-node=8 --gres=none jobs/train.sbatch benchmarks/standin.py --seconds=60

Every rank reads the cluster from ``TF_CONFIG`` (the launcher exported it) and says
``cluster`` (rank, num_workers, workers, restart_count), through :mod:`slurmtf.events`
as the training loop does. As TensorFlow's coordination service does, the chief (rank 0)
listens at its own address (UDP) and every other rank sends it a heartbeat every
``--heartbeat_s`` seconds, which it answers. Training starts when every rank has
registered and lasts ``--seconds``; the chief says ``progress`` every ``--progress_s``
seconds. Then the chief answers ``done``, and every rank says ``done`` and exits 0.

Failures as TensorFlow reports them: when a rank's heartbeats stop for
``--heartbeat_timeout`` seconds (its node frozen, its process stopped), the chief says
``peer_lost`` naming it and its node, with ``heartbeat: true``, and exits 1; a rank whose
chief stops answering does the same about the chief. A signal ends a rank as its default
action does (SIGKILL, SIGTERM, SIGUSR2): nothing is caught.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import sys
import time
from collections.abc import Sequence

from slurmtf.events import emit

REGISTER_TIMEOUT_S = 900.0  # every rank of a wide step starts within this
DONE_GRACE_S = 60.0  # the most the chief waits for the others to hear "done"


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="training time (s)")
    parser.add_argument("--progress_s", type=float, default=5.0, help="the chief's progress")
    parser.add_argument("--heartbeat_s", type=float, default=2.0, help="heartbeat period")
    parser.add_argument("--heartbeat_timeout", type=float, default=10.0, help="a peer is lost")
    return parser.parse_args(argv)


def cluster() -> tuple[int, list[str]]:
    """This rank and every rank's ``host:port``, from ``TF_CONFIG``."""
    config = json.loads(os.environ["TF_CONFIG"])
    workers = list(config["cluster"]["worker"])
    return int(config["task"]["index"]), workers


def node_of(address: str) -> str:
    return address.rsplit(":", 1)[0]


def chief_address(workers: Sequence[str]) -> tuple[str, int]:
    host, port = workers[0].rsplit(":", 1)
    return socket.gethostbyname(host), int(port)


def lost(ranks: Sequence[int], workers: Sequence[str], rank: int) -> int:
    """Say which peers stopped (``peer_lost``); the status a rank then exits with."""
    peers = [{"rank": r, "node": node_of(workers[r])} for r in ranks]
    emit("peer_lost", rank=rank, lost=peers, heartbeat=True)
    return 1


def chief(args: argparse.Namespace, workers: Sequence[str]) -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("", chief_address(workers)[1]))
    sock.setblocking(False)
    seen: dict[int, float] = {0: time.monotonic()}
    told: set[int] = set()  # the ranks that heard "done"
    started = done_at = 0.0
    step, next_progress = 0, 0.0
    deadline = time.monotonic() + REGISTER_TIMEOUT_S
    while True:
        select.select([sock], [], [], 0.5)
        now = time.monotonic()
        for rank, peer in heartbeats(sock):
            seen[rank] = now
            sock.sendto(b"done" if done_at else b"ok", peer)
            if done_at:
                told.add(rank)
        if not started:
            if len(seen) == len(workers):
                started, next_progress = now, now + args.progress_s
            elif now > deadline:
                return lost(sorted(set(range(len(workers))) - set(seen)), workers, 0)
            continue
        if done_at:
            if len(told) == len(workers) - 1 or now - done_at > DONE_GRACE_S:
                emit("done", rank=0, step=step, start_step=0)
                return 0
            continue
        silent = sorted(r for r, t in seen.items() if r and now - t > args.heartbeat_timeout)
        if silent:
            return lost(silent, workers, 0)
        if now >= next_progress:
            step += 1
            total = max(1, round(args.seconds / args.progress_s))
            emit("progress", step=step, total=total, loss=1.0 / step, examples_per_sec=None)
            next_progress += args.progress_s
        if now - started >= args.seconds:
            done_at = now


def heartbeats(sock: socket.socket) -> list[tuple[int, tuple[str, int]]]:
    """Every heartbeat waiting on the chief's socket: (rank, its address)."""
    found: list[tuple[int, tuple[str, int]]] = []
    while True:
        try:
            data, peer = sock.recvfrom(64)
        except BlockingIOError:
            return found
        if data.isdigit():
            found.append((int(data), peer))


def worker(args: argparse.Namespace, rank: int, workers: Sequence[str]) -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    target = chief_address(workers)
    answered = 0.0
    while True:
        sock.sendto(str(rank).encode(), target)
        if select.select([sock], [], [], args.heartbeat_s)[0]:
            data = sock.recv(64)
            answered = time.monotonic()
            if data == b"done":
                emit("done", rank=rank, step=0, start_step=0)
                return 0
            time.sleep(max(0.0, args.heartbeat_s - 0.01))
        elif answered and time.monotonic() - answered > args.heartbeat_timeout:
            return lost([0], workers, rank)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    rank, workers = cluster()
    restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    emit("cluster", rank=rank, num_workers=len(workers), workers=list(workers),
         strategy="standin", restart_count=restart)  # fmt: skip
    return chief(args, workers) if rank == 0 else worker(args, rank, workers)


if __name__ == "__main__":
    sys.exit(main())
