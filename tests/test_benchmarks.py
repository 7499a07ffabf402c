"""Unit tests of the pure parts of benchmarks/: the math, the projection model, the tables.

Benchmarks are not timed tests: nothing here measures or asserts a speed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import bench_resolver, harness, projection, run_all


# ---------------------------------------------------------------------------- efficiency
@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        ({1: 100.0}, {1: 1.0}),
        ({1: 100.0, 2: 200.0}, {1: 1.0, 2: 1.0}),
        ({1: 100.0, 2: 190.0}, {1: 1.0, 2: 0.95}),
        ({1: 100.0, 2: 150.0, 4: 200.0}, {1: 1.0, 2: 0.75, 4: 0.5}),
        ({2: 150.0, 1: 50.0}, {1: 1.0, 2: 1.5}),  # superlinear is reported, not clipped
    ],
)
def test_efficiency(rates: dict[int, float], expected: dict[int, float]) -> None:
    got = harness.efficiency(rates)
    assert got.keys() == expected.keys()
    for n, value in expected.items():
        assert got[n] == pytest.approx(value)


@pytest.mark.parametrize("rates", [{}, {2: 10.0}, {1: 0.0, 2: 1.0}, {1: 1.0, 0: 1.0}])
def test_efficiency_rejects_bad_input(rates: dict[int, float]) -> None:
    with pytest.raises(ValueError, match=r"rate|worker count"):
        harness.efficiency(rates)


@pytest.mark.parametrize(
    ("n", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75), (512, 2 * 511 / 512)]
)
def test_ring_factor(n: int, factor: float) -> None:
    assert harness.ring_factor(n) == pytest.approx(factor)


def test_bus_bandwidth_matches_nccl_tests_definition() -> None:
    # 1 GB in 0.1 s: algbw 10 GB/s; busbw = algbw * 2(n-1)/n.
    assert harness.bus_bandwidth(1e9, 0.1, 2) == pytest.approx(10e9)
    assert harness.bus_bandwidth(1e9, 0.1, 8) == pytest.approx(17.5e9)
    with pytest.raises(ValueError, match="seconds"):
        harness.bus_bandwidth(1e9, 0.0, 2)


@pytest.mark.parametrize(
    ("values", "mid"), [([3.0], 3.0), ([3.0, 1.0], 2.0), ([5.0, 1.0, 3.0], 3.0)]
)
def test_median(values: list[float], mid: float) -> None:
    assert harness.median(values) == mid


# ---------------------------------------------------------------------------- tables
def test_markdown_table_aligns_numbers_right_and_text_left() -> None:
    text = harness.markdown_table(
        ["name", "rate", "note"], [["mnist", 1234.5678, None], ["resnet", 0.951234, True]]
    )
    lines = text.splitlines()
    assert lines[0] == "| name | rate | note |"
    assert lines[1] == "| --- | ---: | --- |"
    assert lines[2] == "| mnist | 1,235 | — |"
    assert lines[3] == "| resnet | 0.951 | yes |"


def test_markdown_table_rejects_ragged_rows() -> None:
    with pytest.raises(ValueError, match="cells"):
        harness.markdown_table(["a", "b"], [[1]])


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "—"), (0.0, "0"), (12345.6, "12,346"), (0.000123456, "0.000123"), (7, "7")],
)
def test_fmt(value: object, text: str) -> None:
    assert harness.fmt(value) == text


# ---------------------------------------------------------------------------- projection
IB = projection.INTERCONNECTS[0]


def test_resnet50_gradient_size() -> None:
    assert pytest.approx(102.2e6, rel=1e-3) == projection.RESNET50_GRAD_BYTES


def test_allreduce_time_ring_formula() -> None:
    nbytes = 100e6
    n = 16  # two nodes: the NICs are the bottleneck
    busbw = IB.nic_line_rate * IB.nic_efficiency
    expected = 2 * 15 / 16 * nbytes / busbw + 2 * 15 * IB.inter_alpha
    assert projection.allreduce_time(n, nbytes, IB) == pytest.approx(expected)
    assert projection.allreduce_time(1, nbytes, IB) == 0.0


def test_allreduce_inside_one_node_uses_nvlink() -> None:
    expected = 2 * 7 / 8 * 1e8 / IB.intra_busbw + 2 * 7 * IB.intra_alpha
    assert projection.allreduce_time(8, 1e8, IB) == pytest.approx(expected)


def test_tree_has_log_latency() -> None:
    ring = projection.allreduce_time(512, 0.0, IB, "ring")
    tree = projection.allreduce_time(512, 0.0, IB, "tree")
    assert ring == pytest.approx(2 * 511 * IB.inter_alpha)
    assert tree == pytest.approx(2 * 9 * IB.inter_alpha)
    with pytest.raises(ValueError, match="algorithm"):
        projection.allreduce_time(8, 1.0, IB, "butterfly")


def test_project_efficiency_without_overlap() -> None:
    work = projection.Workload("w", step_time=0.064, grad_bytes=1e8, batch_per_gpu=256)
    got = projection.project(work, IB, 64)
    t_ar = projection.allreduce_time(64, 1e8, IB)
    assert got["exposed_s"] == pytest.approx(t_ar)
    assert got["efficiency"] == pytest.approx(0.064 / (0.064 + t_ar))
    assert got["images_per_s"] == pytest.approx(64 * 256 / (0.064 + t_ar))


def test_overlap_hides_at_most_the_backward_pass() -> None:
    work = projection.Workload("w", step_time=0.03, grad_bytes=1e9, batch_per_gpu=32)
    t_ar = projection.allreduce_time(32, 1e9, IB)
    full = projection.project(work, IB, 32, overlap=1.0)
    assert full["exposed_s"] == pytest.approx(t_ar - work.backward_fraction * 0.03)
    part = projection.project(work, IB, 32, overlap=0.5)
    assert part["exposed_s"] == pytest.approx(t_ar - min(0.5 * t_ar, 0.02))


def test_efficiency_falls_with_scale_and_slower_networks() -> None:
    work = projection.default_workloads()[1]
    effs = [projection.project(work, IB, n)["efficiency"] for n in projection.GPU_COUNTS]
    assert effs == sorted(effs, reverse=True)
    assert all(0 < e <= 1 for e in effs)
    slow = projection.INTERCONNECTS[2]
    assert projection.project(work, slow, 64)["efficiency"] < effs[3]


def test_model_inputs_are_validated() -> None:
    with pytest.raises(ValueError, match="overlap"):
        projection.project(projection.default_workloads()[0], IB, 8, overlap=1.5)
    with pytest.raises(ValueError, match="positive"):
        projection.Workload("w", step_time=0.0, grad_bytes=1.0, batch_per_gpu=1)
    with pytest.raises(ValueError, match="nic_efficiency"):
        projection.Interconnect("x", 8, 1.0, 1.0, nic_efficiency=0.0)


def test_projection_run_and_markdown_cover_every_case() -> None:
    result = projection.run(measured_img_s=3000.0)
    n_cases = 3 * len(projection.INTERCONNECTS) * 2 * 2 * len(projection.GPU_COUNTS)
    assert len(result["rows"]) == n_cases
    text = projection.markdown(result)
    assert "| interconnect | 8 | 16 | 32 | 64 | 128 | 256 | 512 |" in text
    assert "measured (3,000 img/s)" in text
    assert not math.isnan(sum(r["efficiency"] for r in result["rows"]))


# ---------------------------------------------------------------------------- run_all
def test_parse_only() -> None:
    assert run_all.parse_only(None) == list(run_all.NAMES)
    assert run_all.parse_only("projection,scaling") == ["scaling", "projection"]
    with pytest.raises(ValueError, match="HINT"):
        run_all.parse_only("scaling,nope")


def test_run_all_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_all.main(["--only", "nope"]) == 2
    assert "unknown" in capsys.readouterr().err


def test_report_from_json(tmp_path: Path) -> None:
    run_all.main(["--only", "projection", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "projection.json").read_text())
    assert data["name"] == "projection"
    assert "machine" in data
    report = (tmp_path / "results.md").read_text()
    assert "Projection to 8-512 GPUs" in report
    assert (tmp_path / "projection.png").exists()
    pending = {"name": "gpu", "pending": True, "reason": "no GPU", "command": "python -m x"}
    (tmp_path / "gpu.json").write_text(json.dumps(pending))
    report = run_all.render_report(tmp_path)
    assert "**PENDING:** no GPU" in report
    assert "python -m x" in report


# ---------------------------------------------------------------------------- scaling
PROGRESS_LOG = """\
10:00:01 rank0 W Training on SYNTHETIC data (no --data_dir)
10:00:09 rank0 I step 10/40 loss 0.6 accuracy 0.8 50.0 examples/s ETA 0m20s
10:00:14 rank0 I step 20/40 loss 0.1 accuracy 1.0 400.0 examples/s ETA 0m11s
10:00:19 rank0 I step 40/40 loss 0.1 accuracy 1.0 200.0 examples/s ETA 0m00s
"""


def test_steady_rate_skips_the_first_interval_and_weights_by_time() -> None:
    from benchmarks.bench_scaling import steady_rate

    rate, steps = steady_rate(PROGRESS_LOG, global_batch=100)
    # 10 steps at 400/s (2.5 s) + 20 steps at 200/s (10 s): 3,000 examples in 12.5 s.
    assert steps == 30
    assert rate == pytest.approx(3000 / 12.5)


def test_steady_rate_needs_two_lines() -> None:
    from benchmarks.bench_scaling import steady_rate

    with pytest.raises(ValueError, match="progress lines"):
        steady_rate(PROGRESS_LOG.splitlines()[1], global_batch=100)


@pytest.mark.parametrize(
    ("cores", "counts"), [(1, [1]), (2, [1, 2]), (3, [1, 2]), (8, [1, 2, 4, 8])]
)
def test_worker_counts(cores: int, counts: list[int]) -> None:
    from benchmarks.bench_scaling import worker_counts

    assert worker_counts(cores) == counts


def test_scaling_and_allreduce_tables() -> None:
    from benchmarks import bench_allreduce, bench_scaling

    scaling = {
        "worker_counts": [1, 2],
        "note": "2 cores",
        "models": [
            {
                "model": "MNIST CNN",
                "per_replica_batch": 100,
                "rates": {"1": 500.0, "2": 900.0},
                "efficiency": {"1": 1.0, "2": 0.9},
            }
        ],
    }
    text = bench_scaling.markdown(scaling)
    assert "| MNIST CNN | 2 | 100 | 900 | 450 | 0.900 |" in text
    assert "2 cores." in text
    mb = bench_allreduce.MB
    allreduce = {
        "allreduce": {"results": [{"bytes": 4 * mb, "seconds": 0.04, "busbw_bytes_per_s": 1e8}]},
        "tcp": {
            "results": [
                {"bytes": 4 * mb, "one_way": {"bytes_per_s": 4e9}, "two_way": {"bytes_per_s": 2e9}}
            ]
        },
    }
    assert bench_allreduce.rows(allreduce) == [[4, 40.0, 0.1, 4.0, 2.0, 0.05]]


def test_resolver_markdown() -> None:
    result = {
        "sweep": [
            {"tasks": 8, "distribution": "block", "median_ms": 0.1},
            {"tasks": 8, "distribution": "cyclic", "median_ms": 0.2},
        ],
        "resolve_4096_nodes_32768_tasks_ms": 20.0,
        "cli_4096_nodes_32768_tasks_ms": 220.0,
        "python_startup_ms": 110.0,
        "import_slurmtf_ms": 50.0,
        "targets_met": True,
    }
    text = bench_resolver.markdown(result)
    assert "| 8 | 0.1 | 0.2 |" in text
    assert "Targets met: yes." in text


def test_gpu_pending_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import bench_gpu

    monkeypatch.setattr(bench_gpu, "gpu_names", list)
    result = bench_gpu.run()
    assert result["pending"] is True
    assert "run_all --only gpu" in result["command"]
