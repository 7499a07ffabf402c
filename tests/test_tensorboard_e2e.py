"""``slurmtf tensorboard DIR`` for real: TensorBoard serves a run's scalars and a 4-point
sweep's HParams rows, read through its HTTP data API as its page asks for them, and
Ctrl-C ends it. No Slurm, no TensorFlow (TensorBoard runs on its stub)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmtf.monitor import hparams
from slurmtf.monitor.sweep_rows import SweepRow, point_row
from tests.helpers import tensorboard_page as page


def _scalars(folder: Path, tag: str, values: list[float]) -> None:
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb

    hparams.write_events(folder, [(scalar_pb(tag, v), step) for step, v in enumerate(values)])


def _points(logs: Path) -> list[SweepRow]:
    rows = []
    for task, lr in enumerate(["0.1", "0.03", "0.01", "0.003"]):
        events = [{"event": "launch", "params": {"lr": lr, "opt": "sgd"}},
                  {"event": "eval", "step": 20, "loss": 1.0 - task / 10,
                   "accuracy": 0.6 + task / 10},
                  {"event": "done", "step": 20}]  # fmt: skip
        rows.append(point_row(f"9_{task}", "COMPLETED", 0, events, logs=str(logs / "x")))
    return rows


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """``slurmtf tensorboard`` over a run's summaries and a 4-point sweep's HParams
    folder, started as a user would; its base URL."""
    pytest.importorskip("tensorboard")  # the project's tensorboard extra (dev installs it)
    root = tmp_path / "summaries"
    _scalars(root / "mnist" / "train", "loss", [2.0, 1.0, 0.5])
    _scalars(root / "mnist" / "eval", "accuracy", [0.5, 0.8])
    hparams.write_sweep("9", _points(root), root / "hparams")
    with page.served([str(root)]) as (base, _):
        yield base


@pytest.mark.slow
def test_tensorboard_serves_scalars_and_the_sweeps_hparams(served: str) -> None:
    """The runs, the scalars and the 4 HParams rows, through the data API the page calls."""
    base = served
    runs = page.until(lambda a: len(a) >= 6, f"{base}/data/runs")
    assert {"summaries/mnist/train", "summaries/mnist/eval"} <= set(runs)
    tags = page.get(f"{base}/data/plugin/scalars/tags")
    assert tags["summaries/mnist/train"] == {"loss": {"displayName": "", "description": ""}}
    assert page.scalars(base, "summaries/mnist/train", "loss") == [2.0, 1.0, 0.5]
    experiment = page.until(
        lambda a: a.get("hparamInfos"), f"{base}/data/plugin/hparams/experiment",
        {"experimentName": ""},
    )  # fmt: skip
    assert [h["name"] for h in experiment["hparamInfos"]] == ["lr", "opt"]
    found = {
        row["hparams"]["lr"]: {tag: round(v, 4) for tag, v in row["metrics"].items()}
        for row in page.hparams_rows(base, 4)
    }
    assert found == {
        lr: {"loss": round(1.0 - t / 10, 4), "accuracy": round(0.6 + t / 10, 4)}
        for t, lr in enumerate([0.1, 0.03, 0.01, 0.003])
    }


@pytest.mark.slow
def test_tensorboard_page_in_headless_chromium(served: str, tmp_path: Path) -> None:
    """Headless Chromium loads the page: the scalars dashboard lists the run's tags, the
    HParams table its 4 points with the metrics; a screenshot of each is kept (in the
    test's tmp_path, and in $SLURMTF_SCREENSHOTS when set)."""
    from tests.helpers.chromium import Browser

    with Browser(tmp_path / "profile") as browser:
        for name, words in [
            ("scalars", ["summaries/mnist/train", "summaries/mnist/eval", "loss"]),
            ("hparams", ["9_0", "9_1", "9_2", "9_3", "final accuracy (eval, else train)"]),
        ]:
            tab = browser.open(f"{served}/#{name}")
            browser.wait_for(tab, words)
            page.keep_screenshot(browser.screenshot(tab, tmp_path / f"tensorboard-{name}.png"))
