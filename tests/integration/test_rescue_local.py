"""The survivors' memory is the checkpoint: a killed rank costs at most one step, and the
run ends with the weights of the same run undisturbed.

Two ``--cluster=local`` jobs of bundled MNIST with the same seed, data and worker count:
one undisturbed, one whose rank 1 is SIGKILLed well after the last periodic save. The
disturbed job restarts in place and resumes from the step rank 0 held at the kill
(``rescued`` and ``resumed`` events), not from the periodic checkpoint, and both end with
one weights checksum, bit for bit (fp32 on CPU sums in the same order every run; on
Keras 2 without dropout, see KERAS_2).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurmtf.events import parse_events
from slurmtf.runtime.recovery.endings import reached_step
from tests.helpers.localjobs import model_pid, wait_for
from tests.prereqs import keras_2

pytestmark = [pytest.mark.tf, pytest.mark.slow, pytest.mark.tf_core]

# Keras 2 (TensorFlow 2.15) draws dropout masks from TensorFlow's stateful random ops,
# whose state no checkpoint holds: a resumed run draws other masks. There the runs train
# without dropout, and the weights must still match bit for bit.

KERAS_2 = keras_2()
STEPS = 250  # 100 steps after the kill: the resumed run must still end as the calm one
WARM = {"SLURMTF_WARM_STANDBY": "1"}  # the next attempt's ranks wait ready
COLD = {"SLURMTF_WARM_STANDBY": "0"}  # new processes (auto would warm a run past 2 min)
KILL_AFTER = 150  # steps; the periodic saves are at 100 and 200 and at the end
TRAIN = ["--batch_size=16", "--log_every=1", "--num_threads=1", "--seed=7", "--eval_steps=1",
         f"--train_steps={STEPS}", "--checkpoint_every=100",
         *(["--dropout_rate=0"] if KERAS_2 else [])]  # fmt: skip


def submit(
    tmp: Path, name: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], Path, Path]:
    model_dir, logs = tmp / f"{name}-model", tmp / f"{name}-logs"
    argv = [sys.executable, "-m", "slurmtf.cli", "submit", "--cluster=local", "--nodes=2",
            "--model=mnist", f"--log_dir={logs}", "--max_restarts=2",
            "--", f"--model_dir={model_dir}", *TRAIN]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})  # fmt: skip
    return proc, model_dir, logs


def finish(proc: subprocess.Popen[str], timeout: float = 420) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out
    return out


def rank_events(logs: Path, job_id: str, rank: int) -> list[dict[str, Any]]:
    path = logs / f"{job_id}_{rank}_log.out"
    return parse_events(path.read_text(errors="replace")) if path.exists() else []


def reached(logs: Path, job_id: str) -> int:
    """The highest step rank 0 has reported so far (0 before its first report)."""
    return reached_step(rank_events(logs, job_id, 0)) or 0


def finals(logs: Path, job_id: str) -> list[dict[str, Any]]:
    return [[e for e in rank_events(logs, job_id, r) if e["event"] == "done"][-1] for r in (0, 1)]


def kill_past_the_save(
    proc: subprocess.Popen[str], logs: Path, rank: int
) -> tuple[int, Callable[[], str]]:
    """SIGKILL ``rank``'s model process once rank 0 reported :data:`KILL_AFTER` steps; the
    step rank 0 had reported then, and a reader of the job's logs (for failures)."""
    job_id = str(proc.pid)  # a local job's id is its runner's pid

    def text() -> str:
        return "\n".join(
            p.read_text(errors="replace")[-2000:] for p in sorted(logs.glob("*")) if p.is_file()
        )

    wait_for(lambda: reached(logs, job_id) >= KILL_AFTER and warm_ready(logs, job_id), 300,
             "training past the save", text, running=lambda: proc.poll() is None)  # fmt: skip
    pid = model_pid(job_id, rank)
    assert pid is not None, f"rank {rank}'s model process"
    os.kill(pid, signal.SIGKILL)
    KILLED[job_id] = time.time()
    return reached(logs, job_id), text


KILLED: dict[str, float] = {}  # a job's kill, by the clock the events carry


def training_again(logs: Path, job_id: str) -> float:
    """Seconds from the kill to rank 0's first step of the restart (its events' times)."""
    events = rank_events(logs, job_id, 0)
    starts = [i for i, e in enumerate(events) if e["event"] == "cluster"]
    after = [e for e in events[starts[-1] :] if e["event"] == "progress" and "time" in e]
    return float(after[0]["time"]) - KILLED[job_id]


def warm_ready(logs: Path, job_id: str) -> bool:
    """Every warm rank (if the job has them) has imported TensorFlow and waits."""
    warm = [e for r in (0, 1) for e in rank_events(logs, job_id, r) if e["event"] == "warm"]
    warm_job = any(logs.glob("standby-*"))
    return not warm_job or {e["rank"] for e in warm} == {0, 1}


def check_resumed_from_memory(
    out: str, model_dir: Path, logs: Path, job_id: str, *, at_kill: int, survivor: int
) -> int:
    """One save from ``survivor``'s memory at the kill, the restart resumed there (newer
    than the periodic save), the job's line says so, and the final save pruned it; the
    step resumed at."""
    rescued = [e for r in (0, 1) for e in rank_events(logs, job_id, r) if e["event"] == "rescued"]
    assert [e["rank"] for e in rescued] == [survivor], out
    resumed = [e for e in rank_events(logs, job_id, 0) if e["event"] == "resumed"]
    assert resumed[-1]["source"] == f"rank {survivor}'s memory", resumed
    assert resumed[-1]["step"] == rescued[0]["step"] >= at_kill, (resumed, at_kill)
    said = rf"resumes at step {rescued[0]['step']} from rank {survivor}'s memory \(0 steps redone\)"
    assert re.search(said, out), out
    assert list((model_dir / "rescue").glob("step-*")) == []  # the final save holds it
    step: int = resumed[-1]["step"]
    return step


def test_a_killed_rank_costs_at_most_one_step_and_the_weights_match_undisturbed(
    tmp_path: Path,
) -> None:
    """Rank 1 killed (rank 0 saves; the job has warm ranks, which take over), and rank 0
    killed (rank 1, no longer the chief, saves; new processes); both resume where the
    survivor was and end as the undisturbed run does."""
    calm, _, calm_logs = submit(tmp_path, "calm")
    runs = {victim: submit(tmp_path, f"hit{victim}", WARM if victim == 1 else COLD)
            for victim in (1, 0)}  # fmt: skip
    kills = {victim: kill_past_the_save(proc, logs, victim)
             for victim, (proc, _, logs) in runs.items()}  # fmt: skip
    outs = {victim: finish(proc) for victim, (proc, _, _) in runs.items()}
    assert "warm ranks take over" in outs[1], outs[1]
    assert "warm ranks take over" not in outs[0], outs[0]
    assert not list(runs[1][2].glob("standby-*")), "a warm rank's file was left"
    finish(calm)
    calm_done = finals(calm_logs, str(calm.pid))
    assert len({d["weights_checksum"] for d in calm_done}) == 1
    for victim, (proc, model_dir, logs) in runs.items():
        job_id = str(proc.pid)
        start = check_resumed_from_memory(
            outs[victim], model_dir, logs, job_id, at_kill=kills[victim][0], survivor=1 - victim
        )
        done = finals(logs, job_id)
        kind = "warm" if victim == 1 else "cold"
        again = training_again(logs, job_id)
        print(f"MEASURED rank {victim} killed ({kind} ranks): training again {again:.1f} s, "
              f"resumed at step {start}")  # fmt: skip
        assert [d["step"] for d in done] == [STEPS, STEPS]
        assert done[0]["start_step"] == start
        sums = {d["weights_checksum"] for d in [*done, *calm_done]}
        assert len(sums) == 1, (victim, done, calm_done)
