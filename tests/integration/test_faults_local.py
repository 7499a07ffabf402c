"""Faults between real TensorFlow workers on this machine, no Slurm needed.

Each test starts ``python -m models.mnist`` ranks as local processes with a fake Slurm
environment (one node ``localhost``, N tasks), so they find each other through
slurmtf's resolver exactly as under ``srun``. Then it breaks one of them and measures
how fast, and how clearly, the others give up:

* a rank killed with SIGKILL mid-training (dead peer);
* a rank alive but stuck in Python between steps (heartbeat fine, collective waits);
* a rank whose port is taken, and a peer that never starts at all;
* SIGKILL in the middle of checkpoint writes: the newest checkpoint always restores.

Every process is started in its own session and killed by its PID at teardown; the logs
of every rank are printed when a test fails. Detection times are printed as
``DETECTED <case> <seconds>`` lines (run with ``-s`` to see them; docs/FAILURES.md
records them). The sandbox versions, with a frozen rank and resumption, are in
tests/e2e/test_faults.py.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurmtf.events import parse_events
from tests.helpers.localjobs import (
    Cluster,
    checkpoint_step,
    final_error,
    model_pid,
    names_rank,
    progress_step,
    report,
    wait_for,
)

pytestmark = [pytest.mark.tf, pytest.mark.slow]

# Every variable of a real step that could leak from the environment the tests run in.


# ---------------------------------------------------------------- processes


TRAIN = [
    "--batch_size=16",
    "--log_every=5",
    "--num_threads=1",
    "--seed=7",
]


# ---------------------------------------------------------------- tests


def test_dead_peer_fails_fast_naming_the_lost_task(
    cluster_factory: Callable[[int], Cluster],
) -> None:
    cluster = cluster_factory(2)
    chief, peer = cluster.launch_all([*TRAIN, "--train_steps=100000"])
    wait_for(lambda: progress_step(chief) >= 10, 180, "step 10", cluster.logs)
    peer.signal(signal.SIGKILL)
    killed = time.monotonic()
    status = chief.wait(90)
    detected = time.monotonic() - killed
    report("dead_peer", detected)
    assert status is not None, f"rank 0 still running 90 s after its peer died\n{cluster.logs()}"
    assert status not in (0, 75), cluster.logs()
    assert detected < 60, cluster.logs()
    message = final_error(chief)
    assert "HINT:" in message, cluster.logs()
    assert names_rank(message, cluster, 1), (
        f"rank 0's error does not name the lost task (rank 1, {cluster.worker(1)}): {message}"
    )


# Rank 1 stops calling the train step after STALL_AT progress updates but stays alive:
# its heartbeats go on, only the collective waits (a hung data loader looks like this).
_STALL = """
import sys, time
from slurmtf.training import reporting
calls = [0]
original = reporting.Progress.update
def update(self, *args):
    calls[0] += 1
    if calls[0] >= {stall_at}:
        print("STALLING", flush=True)
        time.sleep(3600)
    return original(self, *args)
reporting.Progress.update = update
from models import mnist
sys.exit(mnist.main(sys.argv[1:]))
"""


@pytest.mark.tf_core
def test_stalled_peer_fails_the_others_within_the_stall_timeout_naming_it(
    cluster_factory: Callable[[int], Cluster],
) -> None:
    """No per-op timer: the progress watchdog notices and names the rank that stopped."""
    cluster = cluster_factory(2)
    timeout = 10
    flags = [
        *TRAIN,
        "--train_steps=100000",
        f"--stall_timeout={timeout}",
        f"--log_dir={cluster.root / 'logs'}",
    ]
    chief = cluster.launch(0, flags)
    peer = cluster.launch(1, flags, python_args=("-c", _STALL.format(stall_at=10)))
    wait_for(lambda: "STALLING" in peer.text(), 180, "rank 1 to stall", cluster.logs)
    stalled = time.monotonic()
    status = chief.wait(timeout + 60)
    detected = time.monotonic() - stalled
    report("stalled_peer", detected)
    assert status is not None, f"rank 0 waits past --stall_timeout\n{cluster.logs()}"
    assert status not in (0, 75), cluster.logs()
    assert detected < timeout + 30, cluster.logs()
    message = final_error(chief)
    assert "HINT:" in message, cluster.logs()
    assert "stall_timeout" in message, message
    assert names_rank(message, cluster, 1), f"rank 1 is not named as the suspect: {message}"
    assert "outside any collective" in message, message
    # The stalled rank's own watchdog fires too and leaves its Python stack in its log.
    assert peer.wait(60) not in (None, 0, 75), cluster.logs()
    assert "time.sleep" in peer.text() or "in update" in peer.text(), peer.text()[-3000:]


@pytest.mark.parametrize("listen", ["127.0.0.1", "0.0.0.0", "::1"])
def test_a_taken_port_fails_that_rank_at_once_naming_it(
    cluster_factory: Callable[[int], Cluster], listen: str
) -> None:
    cluster = cluster_factory(2)
    port = cluster.port_base + 1
    family = socket.AF_INET6 if ":" in listen else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as squatter:
        squatter.bind((listen, port))
        squatter.listen()
        rank = cluster.launch(1, [*TRAIN, "--train_steps=5"])
        status = rank.wait(60)
        elapsed = time.monotonic() - rank.started
    report(f"port_taken[{listen}]", elapsed)
    assert status is not None, f"rank 1 still running with its port taken\n{cluster.logs()}"
    assert status != 0, cluster.logs()
    message = final_error(rank)
    assert str(port) in message, f"the taken port is not named: {message!r}\n{cluster.logs()}"
    assert "HINT:" in message
    assert "Traceback" not in rank.text(), cluster.logs()


@pytest.mark.tf_core
@pytest.mark.parametrize("present", [0, 1], ids=["leader-alone", "leader-missing"])
def test_a_peer_that_never_starts_fails_within_the_registration_timeout(
    cluster_factory: Callable[[int], Cluster], present: int
) -> None:
    cluster = cluster_factory(2)
    missing = 1 - present
    rank = cluster.launch(present, [*TRAIN, "--train_steps=5", "--registration_timeout=10"])
    status = rank.wait(150)
    elapsed = time.monotonic() - rank.started
    report(f"peer_never_starts[{present}]", elapsed)
    assert status is not None, f"rank {present} waited 150 s for a peer\n{cluster.logs()}"
    assert status not in (0, 75), cluster.logs()
    message = final_error(rank)
    assert "HINT:" in message, cluster.logs()
    assert cluster.worker(missing) in message, f"the missing peer is not named: {message}"


def test_kill9_during_checkpoint_writes_never_leaves_a_broken_checkpoint(
    cluster_factory: Callable[[int], Cluster],
) -> None:
    """A checkpoint every step, SIGKILL at random moments: the newest always restores."""
    cluster = cluster_factory(1)
    model_dir = f"--model_dir={cluster.model_dir}"
    rng = random.Random(1234)
    for attempt in range(2):
        before = checkpoint_step(cluster.model_dir) or 0
        rank = cluster.launch(
            0,
            [*TRAIN, "--train_steps=100000", "--checkpoint_every=1", model_dir],
            tag=f"-{attempt}",
        )
        wait_for(
            lambda b=before: (checkpoint_step(cluster.model_dir) or 0) >= b + 3,
            180,
            "three more checkpoints",
            cluster.logs,
        )
        time.sleep(rng.uniform(0.0, 1.5))
        rank.signal(signal.SIGKILL)
        rank.wait(30)
    saved = checkpoint_step(cluster.model_dir)
    assert saved is not None
    final = cluster.launch(0, [*TRAIN, f"--train_steps={saved + 2}", model_dir], tag="-final")
    assert final.wait(180) == 0, cluster.logs()
    done = final.events("done")[-1]
    assert done["start_step"] == saved, done
    assert done["step"] == saved + 2, done


@pytest.mark.tf_core
def test_a_killed_local_rank_restarts_in_place_and_completes(tmp_path: Path) -> None:
    """--cluster=local: SIGKILL of rank 1 mid-training restarts both ranks in place from
    the last checkpoint (recorded as the job scripts record it; free of --max_restarts,
    since the attempt reached a new step); the job completes at the final step with one
    weights checksum."""
    model_dir, logs = tmp_path / "model", tmp_path / "logs"
    argv = [sys.executable, "-m", "slurmtf.cli", "submit", "--cluster=local", "--nodes=2",
            "--model=mnist", f"--log_dir={logs}", "--max_restarts=2",
            "--", f"--model_dir={model_dir}", "--train_steps=60", "--checkpoint_every=5",
            "--eval_steps=1", *TRAIN]  # fmt: skip
    submit = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        job_id = str(submit.pid)  # a local job's id is its runner's pid
        wait_for(lambda: checkpoint_step(model_dir) is not None, 180, "a checkpoint",
                 lambda: _logs(logs), running=lambda: submit.poll() is None)  # fmt: skip
        pid = model_pid(job_id, 1)
        assert pid is not None, "rank 1's model process"
        os.kill(pid, signal.SIGKILL)
        out, _ = submit.communicate(timeout=300)
    finally:
        if submit.poll() is None:
            os.killpg(submit.pid, signal.SIGKILL)
            submit.wait()
        if submit.stdout is not None:
            submit.stdout.close()
    assert submit.returncode == 0, out
    assert re.search(r"restart 1 in place \(0 of 2 without progress: training reached step "
                     r"\d+, MAX_RESTARTS\), \d+\.\d s "
                     r"after rank 1 was killed by SIGKILL", out), out  # fmt: skip
    finals = [[e for e in _events(p) if e["event"] == "done"][-1]
              for p in sorted(logs.glob(f"{job_id}_*_log.out"))]  # fmt: skip
    assert [f["step"] for f in finals] == [60, 60], finals
    assert finals[0]["start_step"] > 0  # resumed from a checkpoint
    assert len({f["weights_checksum"] for f in finals}) == 1
    (record,) = logs.glob(f"recovery-{job_id}.jsonl")
    assert [json.loads(x)["action"] for x in record.read_text().splitlines()] == ["restart"]


def _events(path: Path) -> list[dict[str, Any]]:
    return parse_events(path.read_text(errors="replace"))


def _logs(folder: Path) -> str:
    return "\n".join(
        f"== {p}\n{p.read_text(errors='replace')[-3000:]}"
        for p in sorted(folder.glob("*"))
        if p.is_file()
    )
