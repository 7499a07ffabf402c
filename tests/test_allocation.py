"""What the chief writes to TensorBoard about the allocation (slurmtf.training.allocation),
and the nvidia-smi reader (slurmtf.training.gpu_query): values in, summaries out, no TF."""

from __future__ import annotations

import io
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from slurmtf.check.stragglers import Finding, RankSample, Report
from slurmtf.training import allocation, gpu_query
from slurmtf.training.allocation import Board, Goodput

DATA = Path(__file__).parent / "data" / "nvidia-smi"


class ListWriter:
    def __init__(self) -> None:
        self.scalars_: list[tuple[int, dict[str, float]]] = []
        self.texts: list[tuple[str, int, str]] = []

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.scalars_.append((step, dict(values)))

    def text(self, tag: str, step: int, value: str) -> None:
        self.texts.append((tag, step, value))


def samples(n: int, slow: int | None = None) -> list[RankSample]:
    return [
        RankSample(r, f"node{r}", 0.3 if r == slow else 0.1, 0.0 if r == slow else 0.2)
        for r in range(n)
    ]


def test_rank_scalars_per_rank_and_aggregates() -> None:
    values = allocation.rank_scalars(samples(3, slow=2))
    assert values["allocation/rank2/compute_s"] == pytest.approx(0.3)
    assert values["allocation/rank0/wait_s"] == pytest.approx(0.2)
    assert values["allocation/compute_s/max"] == pytest.approx(0.3)
    assert values["allocation/compute_s/median"] == pytest.approx(0.1)
    assert values["allocation/wait_s/min"] == pytest.approx(0.0)


@pytest.mark.parametrize("ranks", [1, 16, 17, 1024])
def test_rank_scalars_are_capped(ranks: int) -> None:
    values = allocation.rank_scalars(samples(ranks))
    per_rank = [t for t in values if t.startswith("allocation/rank")]
    assert len(per_rank) == 2 * min(ranks, allocation.MAX_RANK_SCALARS)
    assert len(values) == len(per_rank) + 6


def test_straggler_and_recovery_summaries() -> None:
    found = Finding(3, "node3", "compute", 0.42, "compute 300 ms a step, 3.0x the median")
    scalars, text = allocation.straggler_summary(Report("straggler", found, 0.0))
    assert scalars == {"allocation/straggler/cost": 0.42, "allocation/straggler/rank": 3.0}
    assert "node3 (rank 3)" in text
    assert "42 %" in text
    scalars, text = allocation.straggler_summary(Report("straggler_recovered", found, 0.0))
    assert scalars["allocation/straggler/cost"] == 0.0
    assert text.startswith("straggler recovered: node3 (rank 3)")


RECORDS = [
    {"time": 1.0, "attempt": 0, "action": "restart", "why": "rank 1 lost", "status": 1,
     "seconds": 12.4, "line": "restart 1/3 in place"},
    {"time": 2.0, "attempt": 1, "action": "requeue", "why": "preempted", "status": 75},
]  # fmt: skip


def test_recovery_text_names_cause_and_cost() -> None:
    text = allocation.recovery_text(RECORDS[0])
    assert "restart after attempt 0" in text
    assert "cause: rank 1 lost" in text
    assert "cost: 12 s from the failure to the decision" in text
    assert text.endswith("restart 1/3 in place")
    assert "cause: preempted; exit status 75" in allocation.recovery_text(RECORDS[1])


def test_the_start_after_a_decision_writes_what_it_cost() -> None:
    """The last decision before a start costs the seconds from its failure to the start
    (its own seconds from the failure to the decision included) and the steps redone."""
    (first, last) = allocation.new_recovery(RECORDS, [], now=32.0, redone=3)
    assert "cost: 12 s from the failure to the decision" in first[1]  # superseded: its own
    assert "cost: 30.0 s from the failure to this start, 3 steps computed again" in last[1]
    restart = allocation.new_recovery(RECORDS[:1], [], now=10.0, redone=1)[0][1]
    assert "cost: 21.4 s from the failure to this start, 1 step computed again" in restart
    assert allocation.start_cost({"action": "requeue"}, 5.0, 0) == ""  # no time: no cost


def test_a_restart_writes_no_recovery_line_twice(tmp_path: Path) -> None:
    state = tmp_path / allocation.STATE_NAME
    first = ListWriter()
    Board(first, state).at_start(0, 0, RECORDS[:1], now=100.0)
    again = ListWriter()
    Board(again, state).at_start(40, 1, RECORDS, now=200.0)
    recovery = [t for t in [*first.texts, *again.texts] if t[0] == "allocation/recovery"]
    assert [t[2].split(";")[0] for t in recovery] == [
        "restart after attempt 0",
        "requeue after attempt 1",
    ]
    starts = [t for t in again.texts if t[0] == "allocation/starts"]
    assert starts == [
        ("allocation/starts", 40, "start 2 (restart count 1) at step 40; steps computed again: 0")
    ]


def test_goodput_counts_redone_steps_and_idle_time() -> None:
    good = Goodput()
    assert good.started(0, now=1000.0) == 0
    good.window(step=100, steps=100, seconds=50.0)  # 100 steps, then killed
    assert good.started(60, now=1100.0) == 40  # restored at 60: 40 steps again
    good.window(step=160, steps=100, seconds=50.0)
    assert good.steps_ratio() == pytest.approx(160 / 200)
    assert good.time_ratio(now=1200.0) == pytest.approx(100 / 200)
    assert Goodput().steps_ratio() is None
    assert Goodput().time_ratio(5.0) is None


def test_board_window_writes_goodput_and_keeps_it_across_starts(tmp_path: Path) -> None:
    state = tmp_path / allocation.STATE_NAME
    writer = ListWriter()
    board = Board(writer, state)
    board.at_start(0, 0, [], now=0.0)
    board.window(10, samples(2), [], seconds=5.0, steps=10, now=10.0)
    step, values = writer.scalars_[-1]
    assert step == 10
    assert values["allocation/goodput/steps"] == 1.0
    assert values["allocation/goodput/time"] == pytest.approx(0.5)
    assert Goodput.load(state).train_s == 5.0


def test_goodput_state_unreadable_starts_afresh(tmp_path: Path) -> None:
    (tmp_path / "g.json").write_text("{not json")
    assert Goodput.load(tmp_path / "g.json") == Goodput()


def test_parse_recorded_nvidia_smi() -> None:
    gpus = gpu_query.parse((DATA / "query-gpu-a100x4.csv").read_text())
    assert [g.index for g in gpus] == [0, 1, 2]  # GPU 3's utilisation is [N/A]
    assert gpus[0] == gpu_query.GpuSample(0, 97.0, 38211.0, 40960.0)
    values = allocation.gpu_scalars(0, gpus)
    assert values["allocation/rank0/gpu2/utilization"] == 0.0
    assert values["allocation/rank0/gpu1/memory_fraction"] == pytest.approx(38187 / 40960)


@pytest.mark.parametrize(
    ("visible", "mine"),
    [
        ("1", gpu_query.GpuSample(1, 95.0, 38187.0, 40960.0)),  # Slurm's physical index
        ("0,2", gpu_query.GpuSample(0, 48.5, 38215.0, 81920.0)),  # two: mean, sums
        (None, gpu_query.GpuSample(0, 64.0, 76402.0, 122880.0)),  # unset: all it sees
        ("GPU-8a1c", gpu_query.GpuSample(0, 64.0, 76402.0, 122880.0)),  # UUIDs: all
        ("3", None),  # GPU 3 reported no utilisation
    ],
)
def test_a_rank_s_own_gpus(visible: str | None, mine: gpu_query.GpuSample | None) -> None:
    gpus = gpu_query.parse((DATA / "query-gpu-a100x4.csv").read_text())
    assert gpu_query.own(gpus, visible) == mine


def test_each_rank_s_gpus_from_the_step_rows(tmp_path: Path) -> None:
    """The chief writes every rank's GPUs as the step's all-reduce carried them, and the
    spread of their utilisation; a rank without an answer writes none."""
    rows = [RankSample(0, "n1", 0.1, 0.1, gpu=(90.0, 30.0, 40.0)),
            RankSample(1, "n2", 0.1, 0.1, gpu=(10.0, 20.0, 40.0)),
            RankSample(2, "n3", 0.1, 0.1)]  # fmt: skip
    writer = ListWriter()
    Board(writer, tmp_path / "a.json").window(5, rows, [], seconds=1.0, steps=1, now=1.0)
    values = writer.scalars_[0][1]
    assert values["allocation/rank1/gpu/utilization"] == 10.0
    assert values["allocation/rank0/gpu/memory_fraction"] == pytest.approx(0.75)
    assert "allocation/rank2/gpu/utilization" not in values
    assert values["allocation/gpu_utilization/median"] == 50.0
    assert allocation.rank_gpu_scalars(rows, max_ranks=1).keys() >= {
        "allocation/rank0/gpu/utilization", "allocation/gpu_utilization/max"}  # fmt: skip
    assert "allocation/rank1/gpu/utilization" not in allocation.rank_gpu_scalars(rows, 1)


@pytest.mark.parametrize(
    ("text", "indexes"),
    [
        ("", []),
        ("97, 38211, 40960\n3, 5, 40960\n", [0, 1]),  # without the index column
        ("No devices were found\n", []),
        ("0, 1, 2, 3, 4\n", []),
        ("0, [Not Supported], 10, 20\n1, 50, 10, 20\n", [1]),
    ],
)
def test_parse_edge_cases(text: str, indexes: list[int]) -> None:
    assert [g.index for g in gpu_query.parse(text)] == indexes


class FakeChild:
    def __init__(self, out: bytes, code: int | None) -> None:
        self.stdout = io.BytesIO(out)
        self.returncode = code
        self.killed = False

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.killed = True
        self.returncode = -9

    def wait(self) -> int | None:
        return self.returncode


def test_probe_without_nvidia_smi_starts_nothing() -> None:
    def popen(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("started")

    probe = gpu_query.GpuProbe(popen=popen, which=lambda name: None)
    assert probe.latest() == []
    assert probe.latest() == []


def test_probe_reads_the_previous_windows_answer_and_kills_a_slow_one() -> None:
    sample = (DATA / "query-gpu-a100x4.csv").read_bytes()
    children = [FakeChild(sample, 0), FakeChild(b"", None), FakeChild(sample, 0)]
    started: list[list[str]] = []

    def popen(args: list[str], **kwargs: Any) -> FakeChild:
        assert kwargs["stdout"] is subprocess.PIPE
        started.append(args)
        return children[len(started) - 1]

    probe = gpu_query.GpuProbe(popen=popen, which=lambda name: "/usr/bin/nvidia-smi")
    assert probe.latest() == []  # the first window only asks
    assert len(probe.latest()) == 3  # the answer to the first query
    assert probe.latest() == []
    assert children[1].killed
    probe.close()
    assert started[0] == gpu_query.QUERY
    assert len(started) == 3


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_fit_board_writes_rates_and_goodput_once_a_window(tmp_path: Path) -> None:
    """``model.fit``'s board (slurmtf.fit.AllocationBoard): a window every ``every_s``
    seconds of batches with steps and examples per second and the goodput; a last window
    at the end; nothing for a window without a step."""
    from slurmtf.training.fit_board import FitBoard

    writer, clock = ListWriter(), Clock()
    board = Board(writer, tmp_path / allocation.STATE_NAME)
    board.at_start(10, 1, RECORDS, now=100.0)
    fit = FitBoard(board, every_s=30.0, global_batch=64, clock=clock, wall=lambda: 200.0)
    fit.started(10)
    for step in range(11, 41):  # a step a second
        clock.now += 1.0
        fit.batch_end(step)
    assert [s for s, _ in writer.scalars_] == [40]
    values = writer.scalars_[0][1]
    assert values["allocation/steps_per_sec"] == pytest.approx(1.0)
    assert values["allocation/examples_per_sec"] == pytest.approx(64.0)
    assert values["allocation/goodput/steps"] == pytest.approx(1.0)
    assert not any("/rank" in k for k in values)  # fit's step: no per-rank split
    clock.now += 5.0
    fit.close(40)  # nothing trained since: no window
    assert len(writer.scalars_) == 1
    recovery = [t for t in writer.texts if t[0] == "allocation/recovery"]
    assert "computed again" in recovery[-1][2]


def test_a_fit_board_without_a_batch_size_writes_steps_only(tmp_path: Path) -> None:
    from slurmtf.training.fit_board import FitBoard, board_folder

    writer, clock = ListWriter(), Clock()
    fit = FitBoard(Board(writer, tmp_path / "a.json"), every_s=10.0, clock=clock)
    fit.started(0)
    clock.now = 4.0
    fit.close(8)
    ((step, values),) = writer.scalars_
    assert step == 8
    assert values["allocation/steps_per_sec"] == pytest.approx(2.0)
    assert "allocation/examples_per_sec" not in values
    assert board_folder(None, {"MODEL_DIR": "/m"}) == "/m"
    assert board_folder("/given", {"MODEL_DIR": "/m"}) == "/given"
    assert board_folder(None, {}) is None
