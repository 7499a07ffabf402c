"""``slurmtf tensorboard DIR`` for real: TensorBoard serves a run's scalars and a 4-point
sweep's HParams rows, read through its HTTP data API as its page asks for them, and
Ctrl-C ends it. No Slurm, no TensorFlow (TensorBoard runs on its stub)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmtf.monitor import hparams
from slurmtf.monitor.sweep_rows import SweepRow, point_row

DEADLINE_S = 90.0
ALL_STATUSES = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]


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


def _get(url: str, body: object = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def _until(probe: object, url: str, body: object = None) -> object:
    """The answer at ``url`` once ``probe(answer)`` holds (TensorBoard loads in the
    background), within :data:`DEADLINE_S`."""
    deadline = time.monotonic() + DEADLINE_S
    answer: object = None
    while time.monotonic() < deadline:
        try:
            answer = _get(url, body)
            if probe(answer):  # type: ignore[operator]
                return answer
        except (urllib.error.URLError, ConnectionError, ValueError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url}: last answer {answer!r}")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """``slurmtf tensorboard`` over a run's summaries and a 4-point sweep's HParams
    folder, started as a user would; its base URL, from the ssh line it printed. Ended by
    Ctrl-C (SIGINT to its process group, as a terminal sends it): both end, status 0."""
    pytest.importorskip("tensorboard")  # the project's tensorboard extra (dev installs it)
    root = tmp_path / "summaries"
    _scalars(root / "mnist" / "train", "loss", [2.0, 1.0, 0.5])
    _scalars(root / "mnist" / "eval", "accuracy", [0.5, 0.8])
    hparams.write_sweep("9", _points(root), root / "hparams")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # Ctrl-C's default for the child: a pytest-xdist worker ignores SIGINT, and a Python
    # started with SIGINT ignored keeps ignoring it (no KeyboardInterrupt, no stop).
    before = signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "slurmtf", "tensorboard", str(root)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
            start_new_session=True,
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, before)
    with process:
        try:
            yield _base_url(process)
        finally:
            os.killpg(process.pid, signal.SIGINT)
            try:
                status = process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                status = None
    assert status == 0, "slurmtf tensorboard did not end on Ctrl-C within 30 s"


def _base_url(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    lines = [process.stdout.readline() for _ in range(3)]
    ssh = re.search(r"ssh -L (\d+):localhost:(\d+) \S+@\S+$", lines[1].strip())
    assert ssh is not None, lines
    assert ssh.group(1) == ssh.group(2)
    return f"http://localhost:{ssh.group(1)}"


@pytest.mark.slow
def test_tensorboard_serves_scalars_and_the_sweeps_hparams(served: str) -> None:
    """The runs, the scalars and the 4 HParams rows, through the data API the page calls."""
    base = served
    runs = _until(lambda a: len(a) >= 6, f"{base}/data/runs")
    assert {"summaries/mnist/train", "summaries/mnist/eval"} <= set(runs)  # type: ignore[arg-type]
    tags = _get(f"{base}/data/plugin/scalars/tags")
    assert tags["summaries/mnist/train"] == {"loss": {"displayName": "", "description": ""}}  # type: ignore[index]
    loss = _get(f"{base}/data/plugin/scalars/scalars?run=summaries/mnist/train&tag=loss")
    assert [point[2] for point in loss] == [2.0, 1.0, 0.5]  # type: ignore[union-attr]
    experiment = _until(
        lambda a: a.get("hparamInfos"), f"{base}/data/plugin/hparams/experiment",
        {"experimentName": ""},
    )  # fmt: skip
    assert [h["name"] for h in experiment["hparamInfos"]] == ["lr", "opt"]  # type: ignore[index]
    request = {"experimentName": "", "allowedStatuses": ALL_STATUSES,
               "startIndex": 0, "sliceSize": 100}  # fmt: skip
    groups = _get(f"{base}/data/plugin/hparams/session_groups", request)
    found = {
        group["hparams"]["lr"]: {m["name"]["tag"]: round(m["value"], 4)
                                 for m in group["metricValues"]}
        for group in groups["sessionGroups"]  # type: ignore[index]
    }  # fmt: skip
    assert found == {
        lr: {"loss": round(1.0 - t / 10, 4), "accuracy": round(0.6 + t / 10, 4)}
        for t, lr in enumerate([0.1, 0.03, 0.01, 0.003])
    }


@pytest.mark.slow
def test_tensorboard_page_in_headless_chromium(served: str, tmp_path: Path) -> None:
    """Headless Chromium loads the page: the scalars dashboard lists the run's tags, the
    HParams table its 4 points with the metrics; a screenshot of each is kept (in the
    test's tmp_path, and in $SLURMTF_SCREENSHOTS when set: docs/images/ is made so)."""
    from tests.helpers.chromium import Browser

    keep = os.environ.get("SLURMTF_SCREENSHOTS")
    shots = []
    with Browser(tmp_path / "profile") as browser:
        for page, words in [
            ("scalars", ["summaries/mnist/train", "summaries/mnist/eval", "loss"]),
            ("hparams", ["9_0", "9_1", "9_2", "9_3", "final accuracy (eval, else train)"]),
        ]:
            tab = browser.open(f"{served}/#{page}")
            browser.wait_for(tab, words)
            shots.append(browser.screenshot(tab, tmp_path / f"tensorboard-{page}.png"))
    for shot in shots:
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert shot.stat().st_size > 20_000  # a drawn page, not a blank one
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            (Path(keep) / shot.name).write_bytes(shot.read_bytes())
