"""Stragglers: detection, the once-only reports, the status line, the per-rank timing
and the kernel's link counters (no TensorFlow)."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from slurmtf.check import stragglers
from slurmtf.check.stragglers import Finding, RankSample, Tracker, find, status_line
from slurmtf.errors import InputError
from slurmtf.monitor import status as watch
from slurmtf.monitor.console import Console, Renderer
from slurmtf.monitor.records import JobPlace
from slurmtf.training import gpu_query, steptiming
from slurmtf.training.flags import TrainConfig
from tests.helpers.fakeslurm import FakeSlurm, scontrol

ROOT = Path(__file__).resolve().parents[1]

NODES = ("node1", "node2", "node3", "node4")
FAST, SLOW = 900.0, 90.0  # Mbit/s


def ring(slow_node: str | None = None) -> dict[str, dict[str, float]]:
    """Each node's send rate to the next in a ring; links touching ``slow_node`` slow."""
    out = {}
    for i, node in enumerate(NODES):
        peer = NODES[(i + 1) % len(NODES)]
        out[node] = {peer: SLOW if slow_node in (node, peer) else FAST}
    return out


def samples(
    compute: tuple[float, ...] = (0.1, 0.1, 0.1, 0.1),
    step: float = 0.2,
    links: dict[str, dict[str, float]] | None = None,
) -> list[RankSample]:
    links = links or ring()
    return [
        RankSample(rank, node, c, step - c, links[node])
        for rank, (node, c) in enumerate(zip(NODES, compute, strict=True))
    ]


def test_balanced_ranks_have_no_straggler() -> None:
    assert find(samples()) is None
    assert find(samples(compute=(0.1, 0.11, 0.09, 0.12))) is None  # within the threshold
    assert find(samples()[:1]) is None  # one rank: nothing to compare


def test_a_slow_computing_rank_is_found_with_its_cost() -> None:
    found = find(samples(compute=(0.1, 0.1, 0.3, 0.1), step=0.32))
    assert found is not None
    assert (found.rank, found.node, found.kind) == (2, "node3", "compute")
    assert found.cost == pytest.approx(0.2 / 0.32)  # its extra compute, a share of the step
    assert "3.0x the median" in found.detail


def test_a_slow_link_names_the_node_all_of_whose_links_are_slow() -> None:
    # node2 sends slowly to node3 and node3 to node4: only node3 has no fast link
    found = find(samples(step=1.0, links=ring("node3")))
    assert found is not None
    assert (found.rank, found.node, found.kind) == (2, "node3", "link")
    assert stragglers.node_link_rates(samples(links=ring("node3")))["node2"] == FAST
    # a wait of 0.9 of the step, of which 1 - 90/900 is the slow link's
    assert found.cost == pytest.approx(0.9 * 0.9)
    assert "link 90 Mbit/s, 10.0x below the median" in found.detail


def test_a_slow_link_that_costs_little_is_not_reported() -> None:
    # the job hardly waits: a slow link it does not use much is not a straggler
    assert find(samples(compute=(0.1,) * 4, step=0.105, links=ring("node3"))) is None


def test_two_nodes_cannot_tell_which_end_of_their_link_is_slow() -> None:
    two = [RankSample(0, "a", 0.1, 1.0, {"b": SLOW}), RankSample(1, "b", 0.1, 1.0, {"a": SLOW})]
    assert find(two) is None


SLOW_RANK = Finding(2, "node3", "link", 0.42, "link 90 Mbit/s, 10.0x below the median")
OTHER = Finding(1, "node2", "compute", 0.3, "compute 300 ms a step, 3.0x the median")


def run(tracker: Tracker, findings: list[Finding | None], every: float = 10.0) -> list[tuple]:
    """Feed one finding per interval of ``every`` seconds from t=1000; the reports."""
    out = []
    for i, finding in enumerate(findings):
        start = 1000.0 + i * every
        for report in tracker.update(start, start + every, finding):
            out.append((report.event, report.finding.node, report.since, start + every))
    return out


def test_one_report_after_the_window_and_no_repeats() -> None:
    reports = run(Tracker(30.0), [None, SLOW_RANK, SLOW_RANK, SLOW_RANK, SLOW_RANK, SLOW_RANK])
    # first slow in the interval from 1010; reported at 1040, when 30 s have passed
    assert reports == [("straggler", "node3", 1010.0, 1040.0)]


def test_a_transient_blip_is_not_reported() -> None:
    blips = [SLOW_RANK, None, SLOW_RANK, SLOW_RANK, None, OTHER, SLOW_RANK, None]
    assert run(Tracker(30.0), blips) == []


def test_one_interval_longer_than_the_window_is_still_a_blip() -> None:
    assert run(Tracker(30.0), [None, SLOW_RANK, None], every=60.0) == []
    assert run(Tracker(30.0), [SLOW_RANK, SLOW_RANK], every=60.0)[0][0] == "straggler"


def test_a_recovered_rank_is_reported_once_then_a_new_one() -> None:
    seq = [SLOW_RANK] * 4 + [None] * 5 + [OTHER] * 4
    reports = run(Tracker(30.0), seq)
    assert reports == [
        ("straggler", "node3", 1000.0, 1030.0),
        ("straggler_recovered", "node3", 1040.0, 1070.0),  # last slow at 1040
        ("straggler", "node2", 1090.0, 1120.0),
    ]


def test_a_short_recovery_does_not_end_the_report() -> None:
    seq = [SLOW_RANK] * 4 + [None, None] + [SLOW_RANK] * 3
    assert [r[0] for r in run(Tracker(30.0), seq)] == ["straggler"]


def _event(report: stragglers.Report) -> dict[str, object]:
    return json.loads(json.dumps({"event": report.event, **report.fields()}))


def test_status_line_names_node_rank_cost_and_since() -> None:
    since = time.mktime((2026, 11, 25, 16, 40, 12, 0, 0, -1))
    report = stragglers.Report("straggler", SLOW_RANK, since)
    line = status_line([{"event": "progress"}, _event(report)])
    assert line == (
        "straggler: node3 (rank 2): 42 % of each step waiting on it since 16:40:12 "
        "(link 90 Mbit/s, 10.0x below the median)"
    )
    assert report.message() == line
    recovered = stragglers.Report("straggler_recovered", SLOW_RANK, since + 60)
    assert status_line([_event(report), _event(recovered)]) == (
        "straggler: none now (node3 (rank 2) recovered, last slow at 16:41:12)"
    )
    assert status_line([{"event": "progress", "step": 3}]) is None  # balanced: nothing
    assert status_line([{"event": "straggler", "rank": "x"}]) is None  # damaged: nothing


def test_slurmtf_status_shows_the_straggler_line(tmp_path: Path) -> None:
    report = stragglers.Report("straggler", SLOW_RANK, 1_700_000_000.0)
    lines = [{"event": "cluster", "global_batch": 32}, {"event": "progress", "step": 4,
             "total": 10, "examples_per_sec": 32.0}, _event(report)]  # fmt: skip
    (tmp_path / "rank0.out").write_text("".join(json.dumps(e) + "\n" for e in lines))
    place = JobPlace("7", tmp_path, "rank{rank}.{kind}", "given")
    text = watch.status_lines("7", FakeSlurm({"scontrol": [scontrol("RUNNING")]}), place)
    assert f"  {report.message()}" in text
    (tmp_path / "rank0.out").write_text("".join(json.dumps(e) + "\n" for e in lines[:2]))
    text = watch.status_lines("7", FakeSlurm({"scontrol": [scontrol("RUNNING")]}), place)
    assert not any("straggler" in line for line in text)


def test_step_timing_emits_its_rank_and_the_chief_reports_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    timing = steptiming.StepTiming(
        every_s=0.0, window_s=0.0, rank=0, nodes=NODES, replicas=4, is_chief=True, meter=None
    )
    assert timing.link_nodes == list(NODES)
    assert timing.extra_input().shape == (8,)
    # rows: [compute, step, GPU util, MiB used, MiB in all, rates to node1..node4];
    # node3's links are the slow ones
    rows = np.zeros((4, 9))
    rows[:, 0], rows[:, 1] = 0.1, 1.0
    rows[1, 2:5] = 90.0, 1000.0, 4000.0  # rank 1 reports its GPU, the others have none
    for rank, node in enumerate(NODES):
        for peer, rate in ring("node3")[node].items():
            rows[rank, 5 + NODES.index(peer)] = rate
    warm_up = np.full((4, 9), 30.0)  # the first steps trace the function: not counted
    for step in range(1, 6):
        timing.add((warm_up if step <= steptiming.WARM_UP_STEPS else rows).ravel(), step)
        if step > steptiming.WARM_UP_STEPS:
            timing.report(step)
    found = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    kinds = [e["event"] for e in found]
    assert kinds == ["timing", "timing", "straggler", "timing"]  # two intervals at least
    assert found[0]["compute_s"] == pytest.approx(0.1)
    assert found[0]["wait_s"] == pytest.approx(0.9)
    assert found[0]["links"] == {"node2": FAST}
    assert (found[2]["node"], found[2]["rank"], found[2]["kind"]) == ("node3", 2, "link")
    assert [s.gpu for s in timing.samples()] == [None, (90.0, 1000.0, 4000.0), None, None]


def test_a_rank_s_own_gpus_ride_on_its_row(tmp_path: Path) -> None:
    """Each interval the rank asks its node's nvidia-smi (a recorded answer here) and puts
    its own GPU's figures (``CUDA_VISIBLE_DEVICES``) into the step's extra input."""
    answer = (ROOT / "tests" / "data" / "nvidia-smi" / "query-gpu-a100x4.csv").read_text()

    def popen(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        return subprocess.Popen(["printf", "%s", answer], stdout=subprocess.PIPE)

    probe = gpu_query.GpuProbe(popen=popen, which=lambda name: "/usr/bin/nvidia-smi")
    timing = steptiming.StepTiming(
        every_s=0.0, window_s=0.0, rank=0, nodes=["n1"], replicas=1, is_chief=False,
        meter=None, gpu=probe, visible="1",
    )  # fmt: skip
    timing.report(1)  # asks; nothing answered yet
    assert list(timing.extra_input()[1:4]) == [0.0, 0.0, 0.0]
    for step in range(2, 100):  # each interval reads the answer of the one before
        time.sleep(0.05)
        timing.report(step)
        if timing.extra_input()[3] > 0:
            break
    assert list(timing.extra_input()[1:4]) == [95.0, 38187.0, 40960.0]  # GPU 1 of the node
    timing.close()


def test_the_window_is_at_least_one_interval() -> None:
    with pytest.raises(InputError, match="--straggler_window"):
        TrainConfig(train_steps=1, timing_every=30, straggler_window=10)
    TrainConfig(train_steps=1, timing_every=0, straggler_window=0)  # off


@pytest.fixture
def sink() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))

    def drain() -> None:
        conn, _ = server.accept()
        with conn:
            while conn.recv(1 << 20):
                pass

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    server.close()


def test_link_meter_rates_what_this_process_sent(sink: int) -> None:
    meter = steptiming.LinkMeter({"127.0.0.1": "node2"})
    assert meter.rates() == {}
    with socket.create_connection(("127.0.0.1", sink)) as conn:
        # The kernel keeps busy time in jiffies (1-4 ms): on an idle machine 4 MiB over
        # loopback can go within one and count 0 us, so send for a tenth of a second.
        end = time.monotonic() + 0.1
        while time.monotonic() < end:
            conn.sendall(b"x" * (1 << 20))
        time.sleep(0.2)
        counters = steptiming.tcp_counters({"127.0.0.1": "node2"})
        assert max(acked for _, acked, _ in counters.values()) >= 4 << 20
        rates = meter.rates()
    assert set(rates) == {"node2"}
    assert rates["node2"] > 10  # Mbit/s over loopback: far more, but the machine is shared
    assert steptiming.LinkMeter({"127.0.0.1": "node2"}).rates() == {}  # fresh: nothing sent


def test_addresses_two_nodes_share_tell_nothing() -> None:
    workers = ["127.0.0.1:1000", "127.0.0.1:1001"]
    assert steptiming.node_addresses(workers, ["node1", "node2"], "node1") == {}
    assert steptiming.node_addresses(workers[:1], ["node2"], "node1") == {"127.0.0.1": "node2"}


def test_logs_render_timing_and_straggler_events_as_text() -> None:
    renderer = Renderer()
    timing = {"event": "timing", "rank": 2, "node": "node3", "step": 40, "compute_s": 0.031,
              "wait_s": 0.94, "links": {"node4": 81.2}}  # fmt: skip
    assert renderer.line(timing) == (
        "rank 2 (node3) at step 40: compute 31 ms, wait 940 ms a step; sends to node4 81 Mbit/s"
    )
    report = stragglers.Report("straggler", SLOW_RANK, 1_700_000_000.0)
    assert renderer.line(_event(report)) == report.message()


def test_the_follower_leaves_timing_lines_to_slurmtf_logs() -> None:
    out = io.StringIO()
    lines = [json.dumps({"event": "timing", "rank": 0, "step": 4}), "plain line"]
    watch._show_stdout(lines, Console(out, live=False), Renderer())
    assert out.getvalue() == "plain line\n"


def test_a_sidecar_evaluator_is_neither_timed_nor_blamed() -> None:
    from types import SimpleNamespace

    from slurmtf.training.steptiming import from_layout

    layout = SimpleNamespace(
        nodes=("node1", "node2", "node3"),
        workers=("node1:1", "node2:2", "node3:3"),
        roles=("worker", "worker", "evaluator"),
        task_index=1,
        is_chief=False,
    )
    timing = from_layout(layout, replicas=2, every_s=0, window_s=60)
    assert timing.nodes == ["node1", "node2"]
    assert timing.rank == 1
