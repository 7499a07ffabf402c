"""tests/helpers/durations.py: per-module seconds from ``--durations=0``, the order of the
modules on xdist workers, and the recorded file it keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import durations

LOG = """\
============================= slowest durations ==============================
121.61s call     tests/e2e/test_batch_host.py::test_a_lost_batch_host[one]
1.50s setup    tests/e2e/test_batch_host.py::test_a_lost_batch_host[one]
0.25s teardown tests/e2e/test_batch_host.py::test_a_lost_batch_host[one]
3.00s call     tests/test_layout.py::test_x
2.00s call     tests/test_layout.py::test_y
========= 1 failed, 2 passed in 130.00s (0:02:10) ==========
== matrix summary
999.00s call     tests/e2e/test_jobs.py::test_mnist_two_nodes
"""


def test_module_seconds_sums_a_modules_phases_and_stops_at_the_suites_end() -> None:
    seconds = durations.module_seconds(LOG.splitlines())
    assert seconds == {"tests/e2e/test_batch_host.py": 123.36, "tests/test_layout.py": 5.0}


def test_merged_keeps_each_modules_largest_figure_longest_first() -> None:
    runs = [{"a.py": 5.0, "b.py": 1.0}, {"a.py": 2.0, "b.py": 9.0, "c.py": 3.0}]
    assert list(durations.merged(runs).items()) == [("b.py", 9.0), ("a.py", 5.0), ("c.py", 3.0)]


def test_longest_first_puts_unmeasured_modules_after_long_ones_in_their_order() -> None:
    seconds = {"slow.py": 300.0, "mid.py": 20.0, "tiny.py": 0.1}
    order = durations.longest_first(["tiny.py", "new1.py", "mid.py", "new2.py", "slow.py"], seconds)
    assert order == ["slow.py", "mid.py", "new1.py", "new2.py", "tiny.py"]


def test_main_writes_the_file_and_prints_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run.log"
    log.write_text(LOG)
    target = tmp_path / "module_seconds.json"
    monkeypatch.setattr(durations, "SECONDS_FILE", target)
    assert durations.main([str(log)]) == 0
    assert json.loads(target.read_text()) == {
        "tests/e2e/test_batch_host.py": 123.36,
        "tests/test_layout.py": 5.0,
    }
    assert durations.read_seconds(target)["tests/test_layout.py"] == 5.0
    out = capsys.readouterr().out
    assert "| `tests/e2e/test_batch_host.py` | 123 | 96.1% |" in out
    assert "| **all 2 modules** | **128** | |" in out


def test_main_refuses_a_log_without_durations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run.log"
    log.write_text("== pytest\n3 passed in 1.00s\n")
    assert durations.main([str(log)]) == 1
    assert "SLURMTF_TEST_DURATIONS=0" in capsys.readouterr().err


def test_the_recorded_file_names_modules_that_exist() -> None:
    seconds = durations.read_seconds()
    assert seconds, f"{durations.SECONDS_FILE} is missing or empty"
    root = durations.SECONDS_FILE.parents[1]
    gone = [m for m in seconds if not (root / m).is_file()]
    assert gone == [], f"{durations.SECONDS_FILE.name} names modules that are gone: {gone}"
