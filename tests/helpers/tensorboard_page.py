"""``slurmtf tensorboard`` started as a user starts it, and TensorBoard's data API read as
its page reads it: the runs, a run's scalars, the HParams table's rows."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

DEADLINE_S = 90.0
ALL_STATUSES = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]


def get(url: str, body: object = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def until(probe: Callable[[Any], Any], url: str, body: object = None) -> Any:
    """The answer at ``url`` once ``probe(answer)`` holds (TensorBoard loads in the
    background), within :data:`DEADLINE_S`."""
    deadline = time.monotonic() + DEADLINE_S
    answer: object = None
    while time.monotonic() < deadline:
        try:
            answer = get(url, body)
            if probe(answer):
                return answer
        except (urllib.error.URLError, ConnectionError, ValueError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url}: last answer {answer!r}")


def scalars(base: str, run: str, tag: str) -> list[float]:
    """A run's values of ``tag``, once TensorBoard has them."""
    url = f"{base}/data/plugin/scalars/scalars?run={urllib.request.quote(run)}&tag={tag}"
    return [point[2] for point in until(lambda a: isinstance(a, list) and a, url)]


def hparams_rows(base: str, count: int) -> list[dict[str, Any]]:
    """The HParams table's rows (its session groups), once there are ``count``: each
    with its ``hparams`` and ``metrics`` (tag -> value)."""
    request = {"experimentName": "", "allowedStatuses": ALL_STATUSES,
               "startIndex": 0, "sliceSize": 100}  # fmt: skip
    groups = until(
        lambda a: len(a.get("sessionGroups", [])) >= count,
        f"{base}/data/plugin/hparams/session_groups", request,
    )["sessionGroups"]  # fmt: skip
    return [
        {"name": g["name"], "hparams": g["hparams"],
         "metrics": {m["name"]["tag"]: m["value"] for m in g["metricValues"]}}
        for g in groups
    ]  # fmt: skip


@contextlib.contextmanager
def served(
    args: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> Iterator[tuple[str, list[str]]]:
    """``slurmtf tensorboard ARGS`` running; its base URL (from the ssh line it printed)
    and its first lines. Ended by Ctrl-C (SIGINT to its process group, as a terminal
    sends it): it must end with status 0 within 30 s."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})}
    # Ctrl-C's default for the child: a pytest-xdist worker ignores SIGINT, and a Python
    # started with SIGINT ignored keeps ignoring it (no KeyboardInterrupt, no stop).
    before = signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "slurmtf", "tensorboard", *args], cwd=cwd,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=full_env,
            start_new_session=True,
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, before)
    with process:
        try:
            assert process.stdout is not None
            lines = [process.stdout.readline() for _ in range(3)]
            yield base_url(lines), lines
        finally:
            os.killpg(process.pid, signal.SIGINT)
            try:
                status = process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                status = None
    assert status == 0, "slurmtf tensorboard did not end on Ctrl-C within 30 s"


def base_url(lines: Sequence[str]) -> str:
    """``http://localhost:PORT`` from the ``ssh -L PORT:localhost:PORT USER@HOST`` line."""
    ssh = re.search(r"ssh -L (\d+):localhost:(\d+) \S+@\S+$", lines[1].strip())
    assert ssh is not None, lines
    assert ssh.group(1) == ssh.group(2)
    return f"http://localhost:{ssh.group(1)}"


def keep_screenshot(shot: Path) -> None:
    """A screenshot is a drawn page (PNG, not blank), kept in ``$SLURMTF_SCREENSHOTS``
    when set (docs/images/ is made so)."""
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000  # a drawn page, not a blank one
    keep = os.environ.get("SLURMTF_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / shot.name).write_bytes(shot.read_bytes())
