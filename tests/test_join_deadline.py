"""slurmtf's own bound on joining the peers, for TensorFlow releases without a registration
barrier: the peers it names, the line it prints, and that joining in time stops it."""

from __future__ import annotations

import socket
import threading

from slurmtf.training.join_deadline import JoinDeadline, answers, missing_peers

PEERS = {0: "node1:12000", 2: "node2:12002", 3: "node2:12003"}


def test_missing_peers_are_the_ones_whose_port_does_not_answer() -> None:
    listening = {"node2:12002"}
    assert missing_peers(PEERS, lambda address: address in listening) == [0, 3]
    assert missing_peers(PEERS, lambda address: True) == []


def test_answers_tells_a_listening_port_from_a_closed_one() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert answers(f"127.0.0.1:{port}")
    assert not answers(f"127.0.0.1:{port}", timeout=0.5)
    assert not answers("no-port-here", timeout=0.5)


def test_the_bound_names_the_missing_peers_with_a_hint() -> None:
    expired: list[tuple[str, list[int]]] = []
    done = threading.Event()

    def on_expiry(message: str, missing: list[int]) -> None:
        expired.append((message, missing))
        done.set()

    deadline = JoinDeadline(
        rank=1,
        peers=PEERS,
        timeout=0.0,
        program="models.mnist",
        on_expiry=on_expiry,
        probe=lambda address: address == "node1:12000",
    )
    deadline.start()
    assert done.wait(30), "the bound never expired"
    deadline.joined()
    message, missing = expired[0]
    assert missing == [2, 3]
    assert message.startswith("models.mnist: the peers did not all join within ")
    assert "--registration_timeout=0 s" in message
    assert "rank 2 (node2:12002), rank 3 (node2:12003)" in message
    assert "HINT:" in message


def test_joining_in_time_stops_the_bound() -> None:
    expired: list[str] = []
    deadline = JoinDeadline(
        rank=0,
        peers=PEERS,
        timeout=60.0,
        on_expiry=lambda message, missing: expired.append(message),
        probe=lambda address: False,
    ).start()
    deadline.joined()
    assert not [t for t in threading.enumerate() if t.name == "slurmtf-join"]
    assert expired == []
