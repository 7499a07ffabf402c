"""The README's main command, ``bash scripts/demo.sh``, as a user runs it.

It sets up (already done here), writes the real-digit sample, starts its own 2-node
sandbox, trains MNIST across both nodes with ``python -m slurmtf.submit --wait``, stops
the sandbox and ends with the held-out accuracy and where the data came from. The demo
passes extra arguments to the model; fewer steps keep CI short (the full demo's accuracy
is in docs/MODELS.md, and tests/integration/test_sample_learns.py holds the >= 0.9 bar).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, require_sandbox_prereqs

pytestmark = [pytest.mark.slurm, pytest.mark.tf, pytest.mark.slow]

STEPS = 46  # two epochs of the 1,437 training digits at the demo's batch of 60


def _slurmd_pids_of(sandbox_dir: Path) -> list[int]:
    """slurmd processes still running with this sandbox's configuration."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"slurmd" in cmdline and str(sandbox_dir).encode() in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.matrix
def test_the_demo_trains_on_real_digits_and_ends_with_held_out_accuracy(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    require_sandbox_prereqs()
    sandbox_dir = tmp_path_factory.mktemp("demo")  # short: slurmstepd's sockets live under it
    env = {
        **os.environ,
        "SLURMTF_SANDBOX_DIR": str(sandbox_dir),
        "LOG_DIR": str(tmp_path / "demo"),
        "DATA_DIR": str(tmp_path / "digits"),
    }
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "scripts/demo.sh", f"--train_steps={STEPS}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    print(f"MEASURED demo_{STEPS}_steps {time.monotonic() - started:.1f}")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    last = done.stdout.strip().splitlines()[-2:]
    accuracy = re.search(r"^demo: held-out accuracy (\d\.\d+) on (\d+) digits", last[0])
    assert accuracy, last
    assert int(accuracy.group(2)) == 360, last  # the fixed held-out split
    assert float(accuracy.group(1)) > 0.5, last  # chance is 0.1
    assert "2 workers" in last[0], last
    assert last[1].startswith(f"demo: data from {tmp_path / 'digits'}"), last
    assert "SHA-256 verified" in last[1], last
    assert "SYNTHETIC" not in output
    # A person's console: human lines, no raw event lines, no TensorFlow info chatter.
    assert '{"event"' not in done.stdout, done.stdout[-4000:]
    assert "Sharding callback duration" not in output
    assert not re.search(r"^I\d{4} ", output, re.MULTILINE), output[-4000:]
    assert re.search(r"^eval at step \d+ .*accuracy", done.stdout, re.MULTILINE), done.stdout
    assert _slurmd_pids_of(sandbox_dir) == [], "the demo left its sandbox running"
