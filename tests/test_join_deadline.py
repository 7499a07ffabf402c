"""slurmtf's own bound on joining the peers, for TensorFlow releases without a registration
barrier: the peers it names, its line and event, and that it ends a process whose main
thread holds the GIL in C (as TensorFlow 2.15-2.18 do while they wait for peers)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from slurmtf.events import parse_events
from slurmtf.tf.join_deadline import answers, message, missing_peers, report

REPO = Path(__file__).resolve().parents[1]
PEERS = {0: "node1:12000", 2: "node2:12002", 3: "node2:12003"}


def test_missing_peers_are_the_ones_whose_port_does_not_answer() -> None:
    listening = {"node2:12002"}
    assert missing_peers(PEERS, lambda address: address in listening) == [0, 3]
    assert missing_peers(PEERS, lambda address: True) == []


def test_answers_tells_a_listening_port_from_a_closed_one() -> None:
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert answers(f"127.0.0.1:{port}")
    assert not answers(f"127.0.0.1:{port}", timeout=0.5)
    assert not answers("no-port-here", timeout=0.5)


def test_the_line_names_the_missing_peers_with_a_hint() -> None:
    line = message("models.mnist", 10, [2, 3], PEERS)
    assert line.startswith("models.mnist: the peers did not all join within ")
    assert "--registration_timeout=10 s" in line
    assert "rank 2 (node2:12002), rank 3 (node2:12003)" in line
    assert "HINT:" in line


def test_the_report_is_a_peer_lost_event_and_one_line(capsys: object) -> None:
    missing = report(1, PEERS, 10, "models.mnist", probe=lambda a: a == "node1:12000")
    out, err = capsys.readouterr()  # type: ignore[attr-defined]
    assert missing == [2, 3]
    (event,) = parse_events(out)
    assert event["event"] == "peer_lost"
    assert event["lost"] == [{"rank": 2, "node": "node2"}, {"rank": 3, "node": "node2"}]
    assert err.count("\n") == 1
    assert "rank 2 (node2:12002)" in err


HOLDS_THE_GIL = """
import ctypes, sys
from slurmtf.tf import join_deadline
from slurmtf.tf.join_deadline import JoinDeadline
join_deadline.GRACE_S = 0.5  # the whole bound in 4 s, not 8.5 (the reporter keeps its 3 s)
deadline = JoinDeadline(rank=0, peers={1: "127.0.0.1:9"}, timeout=float(sys.argv[1]),
                        program="probe").start()
ctypes.PyDLL(None).sleep(int(sys.argv[2]))  # C code that keeps the GIL, as TF's wait does
deadline.joined()
print("joined in time", flush=True)
"""


def _run(timeout: float, block: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", HOLDS_THE_GIL, str(timeout), str(block)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_bound_ends_a_process_whose_main_thread_holds_the_gil() -> None:
    started = time.monotonic()
    done = _run(0.5, 60)
    took = time.monotonic() - started
    assert done.returncode == 1, done
    assert took < 30, f"ended after {took:.0f} s"
    (event,) = parse_events(done.stdout)
    assert event["lost"] == [{"rank": 1, "node": "127.0.0.1"}]
    assert "probe: the peers did not all join within --registration_timeout=0.5 s" in done.stderr
    assert "rank 1 (127.0.0.1:9)" in done.stderr
    assert "Thread 0x" not in done.stderr  # faulthandler's traceback is not the news


def test_joining_in_time_cancels_the_bound_and_its_reporter() -> None:
    done = _run(30, 1)
    assert done.returncode == 0, done
    assert done.stdout.strip() == "joined in time"
    assert done.stderr == ""
