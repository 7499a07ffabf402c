"""Unit tests of the pure parts of benchmarks/: the math, the projection model, the tables.

Benchmarks are not timed tests: nothing here measures or asserts a speed.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_resolver, harness, projection, run_all, soak
from benchmarks.protocol import Options, record_name
from slurmtf.cluster.ports import free_port_base
from slurmtf.events import named, read_events

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SHARED = {"benchmarks", "benchmarks.harness", "benchmarks.protocol"}


def benchmark_imports(path: Path) -> set[str]:
    """The benchmarks modules ``path`` imports (``from benchmarks import x`` names x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("benchmarks")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks"):
            module = str(node.module)
            names = [f"{module}.{a.name}" for a in node.names] if module == "benchmarks" else []
            found |= {module, *names}
    return found


def test_benchmarks_share_helpers_through_the_harness_only() -> None:
    crossed = {p.name: benchmark_imports(p) - SHARED for p in sorted(BENCHMARKS.glob("*.py"))}
    assert {name: sorted(mods) for name, mods in crossed.items() if mods} == {}
    assert "benchmarks.bench_scaling" in benchmark_imports(Path(__file__))  # the reader reads


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
    result = projection.run(Options(args=argparse.Namespace(measured_img_s=3000.0)))
    n_cases = 3 * len(projection.INTERCONNECTS) * 4 * len(projection.GPU_COUNTS)
    assert len(result["rows"]) == n_cases
    text = projection.markdown(result)
    assert "| interconnect | 8 | 16 | 32 | 64 | 128 | 256 | 512 |" in text
    assert "measured (3,000 img/s)" in text
    assert not math.isnan(sum(r["efficiency"] for r in result["rows"]))


def test_compression_shrinks_only_the_bandwidth_term() -> None:
    work = projection.Workload("w", step_time=0.05, grad_bytes=1e9, batch_per_gpu=32)
    net = projection.INTERCONNECTS[2]  # 100 GbE: the network binds
    plain = projection.project(work, net, 64)
    half = projection.project(work, net, 64, compression=2.0)
    t_ar = projection.allreduce_time(64, 1e9, net)
    latency = projection.allreduce_time(64, 0.0, net)
    assert half["allreduce_s"] == pytest.approx(latency + (t_ar - latency) / 2)
    assert half["efficiency"] > plain["efficiency"]
    with pytest.raises(ValueError, match="compression"):
        projection.project(work, net, 8, compression=0.5)


MB = 1 << 20


def _links(fp32_s: float, bf16_s: float) -> dict[str, object]:
    rows = [{"dtype": "fp32", "bytes": 64 * MB, "seconds": fp32_s},
            {"dtype": "bf16", "bytes": 64 * MB, "seconds": bf16_s},
            {"dtype": "bf16", "bytes": 4 * MB, "seconds": 9.0}]  # fmt: skip
    slow = [{"dtype": "fp32", "bytes": 64 * MB, "seconds": 1.0},
            {"dtype": "bf16", "bytes": 64 * MB, "seconds": 1.0}]  # fmt: skip
    return {"rates": [{"rate": "unshaped", "results": slow},
                      {"rate": "1gbit", "results": rows},
                      {"rate": "10gbit", "results": slow}]}  # fmt: skip


def _breakdown(compute: float, reduce: float, step: float) -> dict[str, object]:
    rows = [{"phase": "compute", "setting": "", "seconds": compute},
            {"phase": "all-reduce", "setting": "fp32, Keras (one pack)", "seconds": reduce},
            {"phase": "step", "setting": "fp32, Keras (one pack)", "seconds": step}]  # fmt: skip
    return {"models": [{"links": [{"link": "1gbit", "runs": [{"rows": rows}]}]}]}


def test_measured_compression_and_overlap(tmp_path: Path) -> None:
    # fp32 / bf16 time of the largest tensor at the slowest shaped link, never below 1
    assert projection.measured_compression(_links(0.8, 0.4)) == pytest.approx(2.0)
    assert projection.measured_compression(_links(0.3, 0.4)) == 1.0
    assert projection.measured_compression(None) == 2.0  # nothing measured: the byte ratio
    # hidden = compute + all-reduce alone - step, as a part of the all-reduce
    assert projection.measured_overlap(_breakdown(0.1, 0.1, 0.15)) == pytest.approx(0.5)
    assert projection.measured_overlap(_breakdown(0.1, 0.1, 0.25)) == 0.0
    assert projection.measured_overlap(None) == 0.0
    (tmp_path / "links.json").write_text(json.dumps(_links(0.9, 0.3)))
    (tmp_path / "breakdown.json").write_text(json.dumps(_breakdown(0.1, 0.1, 0.2)))
    result = projection.run(Options(out_dir=tmp_path))
    assert result["assumptions"]["measured_compression"] == pytest.approx(3.0)
    assert result["assumptions"]["measured_overlap"] == 0.0
    assert "bf16 on the wire (3.00x measured)" in projection.markdown(result)


# ---------------------------------------------------------------------------- run_all
def test_parse_only() -> None:
    assert run_all.parse_only(None) == list(run_all.NAMES)
    assert run_all.parse_only("projection,scaling") == ["scaling", "projection"]
    with pytest.raises(ValueError, match="HINT"):
        run_all.parse_only("scaling,nope")


def test_every_benchmark_module_is_run_by_run_all_under_its_own_name() -> None:
    """Each ``bench_*.py`` is in run_all's list and declares its ``BENCHMARK`` through the
    protocol, named as the list names it."""
    modules = sorted(p.stem for p in Path(harness.REPO, "benchmarks").glob("bench_*.py"))
    assert sorted(m.removeprefix("benchmarks.") for m in run_all.MODULES.values()
                  if ".bench_" in m) == modules  # fmt: skip
    for name in run_all.NAMES:
        assert run_all.benchmark(name).name == name


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


@pytest.mark.slow
def test_the_committed_report_is_the_one_its_json_files_make(tmp_path: Path) -> None:
    """docs/benchmarks/results.md is ``run_all --report_only`` of the JSON files beside
    it (rebuild it after writing one there); the plots go to a copy."""
    committed = run_all.DEFAULT_OUT
    for name in run_all.NAMES:
        if (committed / f"{name}.json").exists():
            shutil.copy(committed / f"{name}.json", tmp_path)
    assert run_all.render_report(tmp_path) == (committed / "results.md").read_text()


def producer_of(file_name: str) -> str | None:
    """The module that writes a file of docs/benchmarks/ (``NAME.json`` or a variant
    ``NAME_WHAT.json`` of a benchmark, its table and plots; a soak's record; the report)."""
    stem, _, suffix = file_name.rpartition(".")
    if file_name == "results.md":
        return "benchmarks.run_all"
    if file_name == "soak-failures.json":
        return "benchmarks.soak_failures"
    for model in soak.MODELS:
        if suffix in ("json", "png") and re.fullmatch(rf"soak-{model}(-[\w.-]+)?", stem):
            return "benchmarks.soak"
    for name in run_all.NAMES:
        if suffix in ("json", "md", "png") and re.fullmatch(rf"{name}([_-][\w.-]+)?", stem):
            return run_all.MODULES[name]
    return None


def test_every_file_in_docs_benchmarks_has_a_producer() -> None:
    orphans = sorted(p.name for p in run_all.DEFAULT_OUT.iterdir() if not producer_of(p.name))
    assert orphans == [], f"docs/benchmarks/ files no benchmark writes: {orphans}"


@pytest.mark.parametrize(
    ("name", "producer"),
    [
        ("batch_host_22.05.json", "benchmarks.bench_batch_host"),
        ("check-16-lean-run1.json", "benchmarks.bench_check"),
        ("soak-resnet20-2h.png", "benchmarks.soak"),
        ("teardown.json", None),
        ("links_training.md", "benchmarks.bench_links"),
        ("soak-lstm.json", None),
        ("resolverx.json", None),
    ],
)
def test_a_file_names_its_producer(name: str, producer: str | None) -> None:
    assert producer_of(name) == producer


def test_a_record_name_must_name_its_benchmark() -> None:
    assert record_name("batch_host", "batch_host_22.05") == "batch_host_22.05"
    assert record_name("batch_host", "batch_host") == "batch_host"
    with pytest.raises(argparse.ArgumentTypeError, match="batch_host_WHAT"):
        record_name("batch_host", "host_22.05")


# ---------------------------------------------------------------------------- scaling
PROGRESS_LOG = """\
{"event": "cluster", "rank": 0, "synthetic": true}
{"event": "progress", "step": 10, "total": 40, "loss": 0.6, "accuracy": 0.8, "examples_per_sec": 50.0}
{"event": "progress", "step": 20, "total": 40, "loss": 0.1, "accuracy": 1.0, "examples_per_sec": 400.0}
{"event": "progress", "step": 40, "total": 40, "loss": 0.1, "accuracy": 1.0, "examples_per_sec": 200.0}
"""  # noqa: E501 - event lines as the chief prints them


def test_steady_rate_skips_the_first_interval_and_weights_by_time() -> None:
    rate, steps = harness.steady_rate(PROGRESS_LOG, global_batch=100)
    # 10 steps at 400/s (2.5 s) + 20 steps at 200/s (10 s): 3,000 examples in 12.5 s.
    assert steps == 30
    assert rate == pytest.approx(3000 / 12.5)


def test_steady_rate_needs_two_lines() -> None:
    with pytest.raises(ValueError, match="progress events"):
        harness.steady_rate(PROGRESS_LOG.splitlines()[1], global_batch=100)


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
    mb = harness.MB
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
    result = bench_gpu.run(Options())
    assert result["pending"] is True
    assert "run_all --only gpu" in result["command"]


# ---------------------------------------------------------------------------- restarts
def _fake_proc(root: Path, pid: int, argv: list[str], env: dict[str, str], threads: int) -> None:
    base = root / str(pid)
    (base / "fd").mkdir(parents=True)
    (base / "task").mkdir()
    for n in range(threads):
        (base / "task" / str(pid + n)).mkdir()
    (base / "fd" / "0").write_text("")
    (base / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (base / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()))
    (base / "status").write_text("Name:\tx\nVmRSS:\t  1234 kB\n")


def test_bench_restarts_finds_the_jobs_processes_by_kind(tmp_path: Path) -> None:
    from benchmarks import bench_restarts as br

    job = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"}
    supervisor = ["/usr/bin/python3", "-m", "slurmtf", "job", "mnist", "--", "--train_steps=9"]
    _fake_proc(tmp_path, 10, supervisor, job, 1)  # the batch script, handed over
    _fake_proc(tmp_path, 11, ["slurmstepd: [7.batch]"], {}, 4)
    _fake_proc(tmp_path, 12, ["slurmstepd: [77.0]"], {}, 4)  # another job's
    _fake_proc(tmp_path, 13, ["/usr/bin/srun", "python3", "-m", "models.mnist"], job, 3)
    _fake_proc(tmp_path, 14, ["python3", "-m", "models.mnist"], {**job, "SLURM_PROCID": "1"}, 9)
    _fake_proc(tmp_path, 15, ["python3", "-m", "models.mnist"], {"SLURM_JOB_ID": "8"}, 9)
    found = harness.job_processes("7", tmp_path)
    assert found == {"batch": [10], "stepd": [11], "other": [13], "rank1": [14]}
    assert harness.rank_pids("7", tmp_path) == {1: 14}
    assert harness.proc_figures(14, tmp_path) == {"threads": 9, "fds": 1, "rss_kb": 1234}
    assert harness.proc_figures(99, tmp_path) is None
    assert harness.cpu_seconds(10, tmp_path) is None  # its thread's schedstat unreadable
    (tmp_path / "10" / "task" / "10" / "schedstat").write_text("2500000000 7000 12\n")
    (tmp_path / "14" / "task" / "15" / "schedstat").write_text("1000 0 1\n")
    assert harness.cpu_seconds(10, tmp_path) == 2.5  # nanoseconds on a CPU, every thread
    for tid in (14, *range(16, 23)):
        (tmp_path / "14" / "task" / str(tid) / "schedstat").write_text("250000000 0 1\n")
    assert harness.cpu_seconds(14, tmp_path) == pytest.approx(2.000001)
    assert (
        br.cpu_per_minute([{"time": 0, "batch_cpu_s": 1.0}, {"time": 120, "batch_cpu_s": 2.0}])
        == 0.5
    )


def test_job_processes_finds_the_titled_keeper_and_supervisor(tmp_path: Path) -> None:
    job = {"SLURM_JOB_ID": "7"}
    _fake_proc(tmp_path, 20, ["slurmtf job mnist (keeper)"], job, 1)  # set_title's argv
    _fake_proc(tmp_path, 21, ["slurmtf job mnist (supervisor)"], job, 2)
    (tmp_path / "20" / "stat").write_text("20 (slurmtf-keeper) S 1 " + "0 " * 40 + "\n")
    (tmp_path / "21" / "stat").write_text("21 (slurmtf-superv) S 20 " + "0 " * 40 + "\n")
    _fake_proc(tmp_path, 22, ["slurmtf job mnist (supervisor)"], {"SLURM_JOB_ID": "8"}, 2)
    assert harness.job_processes("7", tmp_path) == {"keeper": [20], "batch": [21]}


def test_bench_restarts_flatness_and_verdict() -> None:
    from benchmarks import bench_restarts as br

    limits = {"batch_fds": 0, "rank_threads_max": 20}
    rows = [{"batch_fds": 5, "rank_threads_max": 100}, {"batch_fds": 5, "rank_threads_max": 110}]
    flat = br.verdicts(rows, limits)
    assert flat["batch_fds"] == {"first": 5, "last": 5, "growth": 0, "limit": 0, "ok": True}
    assert flat["rank_threads_max"]["ok"] is True
    leaky = br.verdicts([*rows, {"batch_fds": 6, "rank_threads_max": 100}], limits)
    assert leaky["batch_fds"]["ok"] is False  # one fd more after the restarts: a leak
    assert br.verdicts(rows[:1], limits) == {}  # one sample compares nothing
    result = {"state": "COMPLETED", "kills": 2, "restarts_in_place": 2, "slurm_restarts": 0,
              "flatness": flat, "left_after_job": {}}  # fmt: skip
    assert br.passed(result)
    assert not br.passed({**result, "left_after_job": {"rank0": [5]}})
    assert not br.passed({**result, "flatness": leaky})
    assert not br.passed({**result, "restarts_in_place": 1})
    assert br.kill_to_training([{"time": 10.0}, {"time": 24.5}, {"time": 37.0}]) == [14.5, 12.5]
    assert br.live("JobState=PENDING Restarts=0")
    assert br.live("JobState=RUNNING Restarts=0")
    assert not br.live("JobState=COMPLETED Restarts=0")
    assert not br.live("")
    assert "PASS" in br.markdown({**result, "samples": [], "load": [1.0, 1.0, 1.0], "pass": True})


# ---------------------------------------------------------------------------- recovery
def test_bench_recovery_reads_the_resumed_step_and_the_table(tmp_path: Path) -> None:
    from benchmarks import bench_recovery as brec

    logs = tmp_path / "logs"
    logs.mkdir()
    lines = [{"event": "cluster"}, {"event": "progress", "step": 11},
             {"event": "progress", "step": 12}, {"event": "cluster"},
             {"event": "progress", "step": 11}]  # fmt: skip
    (logs / "rank0.out").write_text("".join(json.dumps(x) + "\n" for x in lines[:3]))
    out = logs / "rank0.out"
    assert (harness.last_step(out), harness.resumed_step(out)) == (12, None)
    (logs / "rank0.out").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert harness.resumed_step(out) == 11
    row = {"kind": "spare", "path": "in_place", "seconds": 25.2, "steps_lost": 2,
           "slurm_restarts": 0, "competitor_pending": True, "load": [2.0, 2.1, 2.2]}  # fmt: skip
    table = brec.markdown({"results": [row]})
    assert "| spare | in_place | 25.2 | 2 | 0 | pending |" in table


# ---------------------------------------------------------------------------- width
def test_bench_width_shapes_and_verdict() -> None:
    from benchmarks import bench_width as bw

    assert bw.parse_shape("64x16") == (64, 16)
    for bad in ("1x16", "16", "x8", "4x0"):
        with pytest.raises(ValueError, match="HINT"):
            bw.parse_shape(bad)
    quick = {"s": 0.3, "exit": 0}
    result: dict[str, Any] = {
        "nodes": 16, "per_node": 16, "ranks": 256, "state": "COMPLETED",
        "status": quick, "logs": quick, "logs_last_rank": quick,
        "killed": {"action": "restart", "to_decision_s": 0.4, "to_ranks_s": 9.0},
        "frozen": {"action": "restart", "nodes": [f"node{n}" for n in [*range(1, 16), 17]],
                   "to_decision_s": 19.0, "to_ranks_s": 30.0},
        "memory": {"total_mb": 3300.0, "per_rank_mb": 12.4},
        "launch_s": 20.0, "supervisor_cpu_s_per_min": 0.3, "look": {"per_look": 18.0, "files": 18},
    }  # fmt: skip
    assert bw.passed(result)
    assert not bw.passed({**result, "state": "FAILED"})
    assert not bw.passed({**result, "status": {"s": 2.5, "exit": 0}})
    assert not bw.passed({**result, "frozen": {**result["frozen"], "nodes": ["node1"]}})
    table = bw.markdown({"results": [{**result, "pass": True}]})
    assert "| 256 | 16+1 x 16 | 3,300 | 12.4 |" in table
    assert table.rstrip().endswith("| COMPLETED | PASS |")


def test_bench_sweep_table() -> None:
    from benchmarks import bench_sweep

    timing = {"s": 0.5, "max_s": 0.7, "exit": 0, "lines": 1002, "bytes": 147031}
    kinds = ("sweep_table", "sweep_csv", "sweep_json", "status", "sweep_silent")
    result = {"points": 1000, "rows_completed": 1000, **dict.fromkeys(kinds, timing)}
    text = bench_sweep.markdown(result)
    assert "| slurmtf sweep JOB | 1000 | 0.5 | 0.7 | 0 | 1002 | 147031 |" in text
    assert "Rows COMPLETED in the JSON: 1000 of 1000." in text


# ---------------------------------------------------------------------------- stand-in
def _standins(tmp_path: Path, count: int, *args: str) -> list[subprocess.Popen[bytes]]:
    """``count`` stand-in ranks of one step on this machine, each with its TF_CONFIG."""
    base = free_port_base(count)
    workers = [f"127.0.0.1:{base + r}" for r in range(count)]
    ranks = []
    for rank in range(count):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
        env = {**os.environ, "TF_CONFIG": json.dumps(config), "PYTHONPATH": str(harness.REPO)}
        with (tmp_path / f"rank{rank}.out").open("wb") as out:
            ranks.append(subprocess.Popen(
                [sys.executable, str(harness.REPO / "benchmarks" / "standin.py"), *args],
                env=env, stdout=out,
            ))  # fmt: skip
    return ranks


FAST = ["--seconds=1", "--progress_s=0.4", "--heartbeat_s=0.2", "--heartbeat_timeout=2"]


def test_standin_ranks_register_train_and_end_together(tmp_path: Path) -> None:
    ranks = _standins(tmp_path, 4, *FAST)
    assert [p.wait(timeout=60) for p in ranks] == [0, 0, 0, 0]
    chief = read_events(tmp_path / "rank0.out")
    assert chief[0]["event"] == "cluster"
    assert named(chief, "progress")
    for rank in range(4):
        events = read_events(tmp_path / f"rank{rank}.out")
        assert named(events, "cluster")[0]["num_workers"] == 4
        assert named(events, "done"), rank


def test_a_stopped_standin_is_named_lost_by_its_chief(tmp_path: Path) -> None:
    ranks = _standins(tmp_path, 3, "--seconds=60", *FAST[1:])
    try:
        deadline = time.monotonic() + 30
        while not named(read_events(tmp_path / "rank0.out"), "progress"):
            assert time.monotonic() < deadline, "the chief never trained"
            time.sleep(0.1)
        ranks[2].send_signal(signal.SIGSTOP)
        assert ranks[0].wait(timeout=30) == 1
        (lost,) = named(read_events(tmp_path / "rank0.out"), "peer_lost")
        assert lost["lost"] == [{"rank": 2, "node": "127.0.0.1"}]
        assert lost["heartbeat"] is True
    finally:
        for proc in ranks:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()


def test_bench_batch_host_reads_cost_per_minute_and_renders() -> None:
    from benchmarks import bench_batch_host as bb

    first = {"time": 100.0, "watcher": {"threads": 1, "rss_kb": 20000, "cpu_s": 1.0},
             "keeper": {"threads": 1, "rss_kb": 24000, "cpu_s": None}}  # fmt: skip
    last = {"time": 220.0, "watcher": {"threads": 1, "rss_kb": 20100, "cpu_s": 1.5},
            "keeper": {"threads": 1, "rss_kb": 24000, "cpu_s": 0.2}}  # fmt: skip
    cost = bb.cost(first, last)
    assert cost["minutes"] == 2.0
    assert cost["watcher"] == {"threads": 1, "rss_kb": 20100, "cpu_s_per_min": 0.25}
    assert cost["keeper"]["cpu_s_per_min"] is None
    proc = Path(__file__).parent / "data" / "no-such-proc"
    assert harness.cpu_seconds(os.getpid()) is not None
    assert harness.cpu_seconds(1, proc) is None
    result = {"slurm": "22.05.8", "slurmd_timeout": 60, "results": [
        {"case": "host_freeze", "seconds": 101.5, "steps_lost": 3, "restarts": "1",
         "state": "COMPLETED", "load": [1.0], "cost": cost}]}  # fmt: skip
    text = bb.markdown(result)
    assert "| host_freeze | 102 | 3 | 1 | COMPLETED | 1.0 |" in text, text  # 3 figures
    assert "| watcher | 1 | 20100 | 0.25 |" in text, text


@pytest.mark.parametrize(
    ("keras", "flags"),
    [("2.15.0", ["--dropout_rate=0"]), ("3.15.1", []), (None, []), ("nightly", [])],
)
def test_exact_once_flags_drop_dropout_on_keras_2_alone(
    monkeypatch: pytest.MonkeyPatch, keras: str | None, flags: list[str]
) -> None:
    monkeypatch.setattr(harness, "package_version", lambda *names: keras)
    assert harness.exact_once_flags() == flags
