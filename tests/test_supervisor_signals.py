"""The supervisor as a process: USR2 reaching it goes on to the step (srun forwards it to
the ranks), SIGTERM ends the step and the job, and no child is left behind: a fake
``srun`` on PATH that starts a grandchild ignoring SIGTERM. No Slurm, no TensorFlow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The step: notes USR2 and exits 75 on it (as a rank that saved); a grandchild that
# ignores SIGTERM writes its PID and sleeps.
FAKE_SRUN = """#!/bin/bash
trap 'echo usr2 >> "$WORK/seen"; exit 75' USR2
( trap '' TERM; echo $BASHPID > "$WORK/grandchild"; exec sleep 300 ) &
echo started > "$WORK/started"
while true; do sleep 0.1; done
"""


def start(tmp_path: Path) -> subprocess.Popen[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(REPO), "WORK": str(tmp_path),
        "LOG_DIR": str(tmp_path / "logs"), "MODEL_DIR": str(tmp_path / "m"),
        "SLURMTF_NODE_WATCH_S": "0.1", "MAX_RESTARTS": "0",
    }  # fmt: skip
    command = [sys.executable, "-m", "slurmtf", "job", "command", "--", "train"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while not (tmp_path / "grandchild").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_sigterm_ends_the_step_and_leaves_no_child(tmp_path: Path) -> None:
    proc = start(tmp_path)
    grandchild = int((tmp_path / "grandchild").read_text())
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "the job was ended (SIGTERM)" in out, out
    deadline = time.monotonic() + 10
    while not gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(grandchild), f"the step's grandchild {grandchild} outlived the supervisor"


def test_usr2_goes_on_to_the_step(tmp_path: Path) -> None:
    proc = start(tmp_path)
    grandchild = int((tmp_path / "grandchild").read_text())
    proc.send_signal(signal.SIGUSR2)
    out, _ = proc.communicate(timeout=30)
    assert (tmp_path / "seen").read_text() == "usr2\n", out
    assert "srun exited 75" in out, out
    deadline = time.monotonic() + 10
    while not gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(grandchild), f"the step's grandchild {grandchild} outlived its step"
