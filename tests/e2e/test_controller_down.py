"""A finished job while slurmctld is stopped, and on a machine without Slurm's
configuration: ``slurmtf status`` and ``logs`` show its record, final step and logs with
one line saying Slurm did not answer; ``slurmtf cancel`` names what it asked.

Its own 2-node sandbox (no GPUs), since the test stops the controller for good; one
small job through ``slurmtf submit --wait`` (no TensorFlow) that logs events the way the
training loop does. Slurm's own wait for a controller (``MessageTimeout``, 10 s) is most
of the time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmtf.cluster.ports import free_port_base
from slurmtf.sandbox import Sandbox
from tests.e2e.conftest import REPO, SlurmSandbox, require_sandbox_prereqs

PY = sys.executable
CLI = [PY, "-m", "slurmtf.cli"]
# Each rank logs its progress and its end at step 5, as the training loop does.
_RANK = (
    "import json, os; r = int(os.environ['SLURM_PROCID']); "
    "print(json.dumps({'event': 'cluster', 'rank': r, 'global_batch': 8})); "
    "print(json.dumps({'event': 'progress', 'rank': r, 'step': 5, 'total': 5, "
    "'examples_per_sec': 40.0})); "
    "print(json.dumps({'event': 'done', 'rank': r, 'step': 5}))"
)


@pytest.fixture(scope="module")
def own_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    require_sandbox_prereqs()
    sandbox = Sandbox(tmp_path_factory.mktemp("ctld"), nodes=2, gpus_per_node=0)
    sandbox.up()
    try:
        yield SlurmSandbox(sandbox)
    finally:
        sandbox.down()


def _start(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        args, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _check_answers(jid: str, logs: Path, cwd: Path, env: dict[str, str], words: str) -> str:
    """``status`` and ``logs --rank=1`` side by side (each waits for Slurm on its own)."""
    start = time.monotonic()
    running = [_start([*CLI, "status", jid], cwd, env)]
    running.append(_start([*CLI, "logs", jid, "--rank=1"], cwd, env))
    (out, err), (shown, shown_err) = (proc.communicate(timeout=120) for proc in running)
    assert [proc.returncode for proc in running] == [0, 0], out + err + shown + shown_err
    assert f"job {jid}: rank 0 logged 'finished' at step 5, exit status 0" in out, out
    assert "step 5/5" in out, out
    assert f"logs (2 rank(s) in {logs}, found via record)" in out, out
    said = [line for line in out.splitlines() if "Slurm did not answer" in line]
    assert len(said) == 1, out
    assert words in said[0], out
    assert "rank 1: done at step 5" in shown, shown
    assert shown_err.count("Slurm did not answer") == 1, shown_err
    assert words in shown_err, shown_err
    return f"{words}: {time.monotonic() - start:.1f} s"


@pytest.mark.matrix
@pytest.mark.slurm
def test_status_and_logs_of_a_finished_job_without_the_controller(
    own_sandbox: SlurmSandbox, tmp_path: Path
) -> None:
    sbx = own_sandbox
    logs = tmp_path / "logs"
    env = {
        **sbx.env,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "SLURMTF_PORT_BASE": str(free_port_base(8)),
    }
    done = subprocess.run(
        [*CLI, "submit", f"--command=python -c \"{_RANK}\"", "--nodes=2", "--time=5",
         f"--log_dir={logs}", "--wait"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr + sbx.daemon_logs()
    jid = done.stdout.split("submitted job ", 1)[1].split(":", 1)[0]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    # A login node without the configuration: no SLURM_CONF, no /etc/slurm/slurm.conf.
    no_conf = {k: v for k, v in env.items() if k != "SLURM_CONF"}
    if Path("/etc/slurm/slurm.conf").exists():
        pytest.fail("/etc/slurm/slurm.conf exists: scontrol would read it without SLURM_CONF")
    timings = [
        _check_answers(jid, logs, elsewhere, no_conf, "Could not establish a configuration source")
    ]
    cancel = subprocess.run(
        [*CLI, "cancel", jid], env=no_conf, cwd=elsewhere, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert cancel.returncode == 1
    assert f"command='scancel {jid}' found no Slurm configuration" in cancel.stderr
    assert "HINT:" in cancel.stderr

    # The controller stopped.
    pid = sbx.sandbox.live_daemons()["slurmctld"]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while "slurmctld" in sbx.sandbox.live_daemons() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "slurmctld" not in sbx.sandbox.live_daemons()
    timings.append(
        _check_answers(
            jid, logs, elsewhere, env, "Unable to contact slurm controller (connect failure)"
        )
    )
    print("; ".join(timings))
