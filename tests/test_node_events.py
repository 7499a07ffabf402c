"""The node's file of supervised events (slurmtf.events): who writes it, what goes in, and
that the lines of many ranks of one node never mix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurmtf import events
from slurmtf.events import NODE_EVENTS_VAR, emit, node_events_path, parse_events, to_node_file


def test_the_pattern_names_the_node() -> None:
    assert node_events_path("/logs/events-7-%N.jsonl", "gpu12") == Path(
        "/logs/events-7-gpu12.jsonl"
    )


def test_a_supervised_event_goes_to_stdout_and_to_the_nodes_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(NODE_EVENTS_VAR, str(tmp_path / "ev-%N.jsonl"))
    monkeypatch.setenv("SLURMD_NODENAME", "node3")
    emit("progress", step=1)
    emit("peer_lost", rank=4, lost=[{"rank": 9, "node": "node5"}])
    out = parse_events(capsys.readouterr().out)
    assert [e["event"] for e in out] == ["progress", "peer_lost"]
    node = parse_events((tmp_path / "ev-node3.jsonl").read_text())
    assert node == [out[1]]  # the same line; progress is the rank's own log's only


def test_outside_a_supervised_step_there_is_no_nodes_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(NODE_EVENTS_VAR, raising=False)
    monkeypatch.setenv("SLURMD_NODENAME", "node3")
    assert not to_node_file(b"{}\n", {"SLURMD_NODENAME": "node3"})
    assert not to_node_file(b"{}\n", {NODE_EVENTS_VAR: str(tmp_path / "e-%N")})  # no node
    assert list(tmp_path.iterdir()) == []


def test_a_file_it_cannot_write_is_said_once_and_the_rank_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {NODE_EVENTS_VAR: str(tmp_path / "missing" / "e-%N.jsonl"), "SLURMD_NODENAME": "n1"}
    assert not to_node_file(b"{}\n", env)
    assert not to_node_file(b"{}\n", env)
    err = capsys.readouterr().err
    assert err.count(f"slurmtf: {NODE_EVENTS_VAR}: cannot append to") == 1, err


WRITER = """
import sys
from slurmtf.events import emit
for i in range(int(sys.argv[2])):
    emit("peer_lost", rank=int(sys.argv[1]), i=i, lost=[{"rank": 0, "node": "x" * 300}])
"""


def test_the_ranks_of_a_node_append_whole_lines(tmp_path: Path) -> None:
    """16 ranks of one node append 200 events each at once: 3,200 whole lines."""
    env = {NODE_EVENTS_VAR: str(tmp_path / "e-%N.jsonl"), "SLURMD_NODENAME": "n1",
           "PYTHONPATH": str(Path(events.__file__).parents[1])}  # fmt: skip
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(r), "200"], env=env, stdout=subprocess.DEVNULL
        )
        for r in range(16)
    ]
    assert [p.wait(timeout=120) for p in ranks] == [0] * 16
    lines = (tmp_path / "e-n1.jsonl").read_text().splitlines()
    assert len(lines) == 16 * 200
    found = [json.loads(line) for line in lines]  # each line whole: no mixed writes
    for rank in range(16):
        assert [e["i"] for e in found if e["rank"] == rank] == list(range(200))
