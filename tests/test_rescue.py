"""The survivors' saves from memory: one writer per step, complete or absent, the newest
chosen, pruned once a periodic save holds them; and the restart line that names them."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

from slurmtf.runtime.recovery.budget import Budget
from slurmtf.runtime.recovery.decision import decide
from slurmtf.runtime.recovery.endings import Attempt, TaskEnding
from slurmtf.training import rescue
from slurmtf.training.checkpoints import Resumed, newest_state


class FakeCheckpoint:
    """Writes what ``tf.train.Checkpoint.write`` would: ``PREFIX.index`` and a data file."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.written: list[str] = []

    def write(self, prefix: str) -> str:
        Path(prefix).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{prefix}.data-00000-of-00001").write_bytes(b"weights")
        if self.fail:
            raise OSError("disk full")
        Path(f"{prefix}.index").write_bytes(b"index")
        self.written.append(prefix)
        return prefix


def test_the_first_survivor_of_a_step_writes_it_and_the_others_skip(tmp_path: Path) -> None:
    first = rescue.save(FakeCheckpoint(), tmp_path, 391, rank=1)
    again = FakeCheckpoint()
    assert rescue.save(again, tmp_path, 391, rank=0) is None
    assert again.written == []
    assert first == rescue.Rescue(391, 1, tmp_path / "rescue" / "step-391.rank-1")
    assert rescue.newest(tmp_path) == first
    assert first.source == "rank 1's memory"
    assert first.prefix.endswith("step-391.rank-1/ckpt")


def test_a_later_step_wins_and_a_cut_save_is_never_read(tmp_path: Path) -> None:
    rescue.save(FakeCheckpoint(), tmp_path, 10, rank=0)
    with pytest.raises(OSError, match="disk full"):
        rescue.save(FakeCheckpoint(fail=True), tmp_path, 11, rank=1)
    assert [r.step for r in rescue.found(tmp_path)] == [10]  # 11 was cut short
    assert not [p for p in (tmp_path / "rescue").iterdir() if p.name.startswith(".")]
    rescue.save(FakeCheckpoint(), tmp_path, 12, rank=2)
    newest = rescue.newest(tmp_path)
    assert newest is not None
    assert (newest.step, newest.rank) == (12, 2)


def test_a_folder_without_its_index_is_not_a_save(tmp_path: Path) -> None:
    (tmp_path / "rescue" / "step-50.rank-0").mkdir(parents=True)
    assert rescue.newest(tmp_path) is None
    assert rescue.newest(None) is None
    assert rescue.newest(tmp_path / "missing") is None


def test_prune_removes_what_a_periodic_save_holds(tmp_path: Path) -> None:
    for step in (5, 9, 14):
        rescue.save(FakeCheckpoint(), tmp_path, step, rank=0)
    stale = tmp_path / "rescue" / ".step-3.rank-1.999"
    stale.mkdir()
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    fresh = tmp_path / "rescue" / ".step-15.rank-1.998"  # a writer at work now
    fresh.mkdir()
    rescue.prune(tmp_path, 9)
    assert [r.step for r in rescue.found(tmp_path)] == [14]
    names = sorted(p.name for p in (tmp_path / "rescue").iterdir())
    assert names == [".step-15.rank-1.998", "claim-14", "step-14.rank-0"]
    rescue.save(FakeCheckpoint(), tmp_path, 9, rank=0)  # the claim went with the save
    assert [r.step for r in rescue.found(tmp_path)] == [9, 14]


def _attempt(rescued: dict[int, int], reached: int) -> Attempt:
    events = {
        rank: [{"event": "progress", "step": reached}, {"event": "rescued", "step": step}]
        for rank, step in rescued.items()
    }
    events.setdefault(1, [])
    ending = TaskEnding.parse("srun: error: node2: task 1: Killed")
    assert ending is not None
    return Attempt(137, (ending,), events)


def test_the_restart_line_says_where_the_next_start_resumes() -> None:
    attempt = _attempt({0: 391, 2: 391}, reached=390)
    assert attempt.resume_words() == "resumes at step 391 from rank 0's memory (0 steps redone)"
    decision = decide(attempt, Budget(used=0, limit=3))
    assert decision.action == "restart"
    line = decision.line("7", seconds=1.4)
    assert line.startswith("restart 1 ")
    assert line.endswith("; resumes at step 391 from rank 0's memory (0 steps redone)"), line
    trained = _attempt({}, 390)
    trained = dataclasses.replace(trained, events={0: [{"event": "progress", "step": 390}]})
    unsaved = decide(trained, Budget(used=0, limit=3)).line("7")
    assert "steps redone" not in unsaved
    assert unsaved.endswith(
        "; no rank saved step 390 from memory: resumes from the last periodic checkpoint"
    ), unsaved


def test_no_word_on_resuming_when_no_rank_trained() -> None:
    ending = TaskEnding.parse("srun: error: node2: task 1: Killed")
    assert ending is not None
    assert Attempt(137, (ending,), {0: [], 1: []}).resume_words() == ""


def test_steps_a_dead_rank_reported_past_the_save_count_as_redone() -> None:
    attempt = _attempt({2: 40}, reached=41)
    assert attempt.resume_words() == "resumes at step 40 from rank 2's memory (1 step redone)"


def test_a_step_older_than_the_periodic_checkpoint_is_not_rescued(tmp_path: Path) -> None:
    """A rank that froze at step 14 and thawed once the job had saved step 50 without it
    writes nothing: its state is older than the checkpoint."""
    written = FakeCheckpoint()
    assert rescue.save(written, tmp_path, 14, rank=1, saved=50) is None
    assert written.written == []
    assert rescue.found(tmp_path) == []
    for step in (50, 51):  # the checkpoint's own step (the restart line names it) and on
        kept = rescue.save(written, tmp_path, step, rank=1, saved=50)
        assert kept is not None
        assert kept.step == step


def test_a_start_resumes_from_the_rescue_when_it_holds_at_least_the_checkpoint(
    tmp_path: Path,
) -> None:
    """At the checkpoint's own step both hold the same state; the rescue is read, so the
    rank's ``resumed`` event names the survivor as the restart line does."""
    periodic = str(tmp_path / "checkpoints" / "ckpt-15")
    assert newest_state(None, tmp_path) is None
    assert newest_state(periodic, tmp_path) == Resumed(periodic, 15, "checkpoint")
    rescue.save(FakeCheckpoint(), tmp_path, 14, rank=0)
    assert newest_state(periodic, tmp_path) == Resumed(periodic, 15, "checkpoint")
    rescue.save(FakeCheckpoint(), tmp_path, 15, rank=2)
    tie = newest_state(periodic, tmp_path)
    assert tie is not None
    assert (tie.step, tie.source) == (15, "rank 2's memory")
    assert tie.path.endswith("rescue/step-15.rank-2/ckpt")
    rescue.save(FakeCheckpoint(), tmp_path, 16, rank=0)
    assert newest_state(None, tmp_path) == Resumed(
        str(tmp_path / "rescue" / "step-16.rank-0" / "ckpt"), 16, "rank 0's memory"
    )
