"""Unit tests of benchmarks/bench_links.py's tables (no sandbox, no TensorFlow)."""

from __future__ import annotations

import pytest

from benchmarks import bench_links

MB = 1 << 20
RESULT = {
    "rates": [
        {"rate": "unshaped", "tcp_bits_per_s": 3e9,
         "results": [{"dtype": "fp32", "bytes": 16 * MB, "seconds": 0.1,
                      "busbw_bytes_per_s": 16 * MB / 0.1}]},
        {"rate": "1gbit", "tcp_bits_per_s": 0.95e9,
         "results": [{"dtype": "bf16", "bytes": 16 * MB, "seconds": 0.1,
                      "busbw_bytes_per_s": 250e6}]},
    ]
}  # fmt: skip


def test_rows_report_the_fraction_of_the_link_rate() -> None:
    unshaped, shaped = bench_links.rows(RESULT)
    assert unshaped[:4] == ["unshaped", 3.0, "fp32", 16]
    assert unshaped[6] is None  # no cap: no fraction
    assert shaped[0] == "1gbit"
    assert shaped[5] == pytest.approx(0.25)  # GB/s
    assert shaped[6] == pytest.approx(2.0)  # 250 MB/s of fp32 through a 125 MB/s link
    table = bench_links.markdown(RESULT)
    assert table.splitlines()[0].startswith("| link | TCP stream (Gbit/s) |")


def test_training_table() -> None:
    result = {
        "one_worker": {"examples_per_s": 1000.0, "step_ms": 100.0},
        "runs": [{"rate": "1gbit", "dtype": "bf16", "examples_per_s": 1500.0,
                  "step_ms": 133.3, "extra_ms": -33.35, "efficiency": 0.75}],
    }  # fmt: skip
    lines = bench_links.training_markdown(result).splitlines()
    assert len(lines) == 4
    assert "| 1gbit | bf16 |" in lines[3]
