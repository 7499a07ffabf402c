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


@pytest.mark.slow
def test_tensorboard_serves_scalars_and_the_sweeps_hparams(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")  # the project's tensorboard extra (dev installs it)
    root = tmp_path / "summaries"
    _scalars(root / "mnist" / "train", "loss", [2.0, 1.0, 0.5])
    _scalars(root / "mnist" / "eval", "accuracy", [0.5, 0.8])
    hparams.write_sweep("9", _points(root), root / "hparams")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with subprocess.Popen(
        [sys.executable, "-m", "slurmtf", "tensorboard", str(root)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        start_new_session=True,
    ) as process:  # fmt: skip
        try:
            _check(process)
        finally:
            os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: slurmtf and TensorBoard end
            status = process.wait(timeout=30)
    assert status == 0


def _check(process: subprocess.Popen[str]) -> None:
    """The ssh line, then the runs, the scalars and the 4 HParams rows served."""
    assert process.stdout is not None
    lines = [process.stdout.readline() for _ in range(3)]
    ssh = re.search(r"ssh -L (\d+):localhost:(\d+) \S+@\S+$", lines[1].strip())
    assert ssh is not None, lines
    assert ssh.group(1) == ssh.group(2)
    base = f"http://localhost:{ssh.group(1)}"
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
