"""Unit tests of the links and breakdown benchmarks' tables and of the one benchmark CLI
(no sandbox, no TensorFlow)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from benchmarks import bench_breakdown, bench_links, protocol
from benchmarks.protocol import Options

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


def _row(phase: str, setting: str, ms: float, cpu_ms: float = 0.0) -> dict[str, object]:
    return {"phase": phase, "setting": setting, "seconds": ms / 1e3, "cpu_seconds": cpu_ms / 1e3}


BREAKDOWN = {
    "name": "breakdown",
    "models": [{"model": "mnist", "batch": 100, "links": [{
        "link": "1gbit",
        "one_worker": {"workers": 1, "rows": [_row("compute", "", 80.0)]},
        "runs": [{"workers": 2, "rows": [
            _row("compute", "", 90.0),
            _row("all-reduce", "bf16, one pack", 60.0, 20.0),
            _row("step", "bf16, one pack", 160.0),
        ]}],
    }]}],
}  # fmt: skip


def test_breakdown_rows_split_the_step(tmp_path: Path) -> None:
    (row,) = bench_breakdown.rows(BREAKDOWN)
    assert row[:4] == ["mnist", "1gbit", 2, "bf16, one pack"]
    assert row[4:10] == pytest.approx([80.0, 90.0, 60.0, 20.0, 160.0, 70.0])  # exposed 70 ms
    assert row[10] == pytest.approx(90 / 160)  # compute / step
    assert row[11] == pytest.approx(80 / 160)  # efficiency against 1 worker alone
    assert "| mnist | 1gbit | 2 | bf16, one pack |" in bench_breakdown.markdown(BREAKDOWN)
    (path,) = bench_breakdown.plot(BREAKDOWN, tmp_path)
    assert path.stat().st_size > 1000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("fp32:0", [("fp32, Keras (one pack)", "fp32", 0)]),
        ("bf16:4M, fp16:256K", [("bf16, 4 MB packs", "bf16", 4 << 20),
                                ("fp16, 0.25 MB packs", "fp16", 256 << 10)]),
        ("bf16:0", [("bf16, one pack", "bf16", 0)]),
    ],
)  # fmt: skip
def test_parse_settings(text: str, expected: list[tuple[str, str, int]]) -> None:
    assert bench_breakdown.parse_settings(text) == expected


@pytest.mark.parametrize("text", ["int8:0", "bf16:lots", "bf16:-1"])
def test_parse_settings_rejects_bad_items(text: str) -> None:
    with pytest.raises(ValueError, match=r"--settings=.*HINT: DTYPE:BYTES"):
        bench_breakdown.parse_settings(text)


def test_one_command_line_for_every_benchmark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """protocol.main runs a module's BENCHMARK: JSON and table printed, files written."""
    seen = []

    def run(options: Options) -> dict[str, object]:
        seen.append(options)
        return BREAKDOWN

    bench = dataclasses.replace(bench_breakdown.BENCHMARK, run=run)
    assert protocol.main(bench, ["--quick", "--out", str(tmp_path), "--steps=3"]) == 0
    assert seen[0].quick
    assert seen[0].flag("steps", None) == 3
    assert "| mnist | 1gbit |" in capsys.readouterr().out
    assert json.loads((tmp_path / "breakdown.json").read_text())["name"] == "breakdown"
    assert (tmp_path / "breakdown.md").exists()
    assert (tmp_path / "breakdown_mnist.png").exists()
