"""A rank's own temporary folder (slurmtf.runtime.rank.temp_folder), in real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from slurmtf.runtime.rank.temp_folder import folder_for

# A rank in miniature: its own folder, a file there as AutoGraph writes one, then its end.
CHILD = """
import os, sys, tempfile, time
from slurmtf.runtime.rank.temp_folder import use_own
folder = use_own(os.environ)
with tempfile.NamedTemporaryFile(prefix="__autograph_generated_file", suffix=".py",
                                 delete=False) as f:
    f.write(b"x = 1\\n")
print(folder, f.name, flush=True)
if sys.argv[1] == "wait":
    time.sleep(60)
"""


def _rank(tmp: Path, how: str, job: str = "77", rank: str = "1") -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(tmp), "SLURM_JOB_ID": job, "SLURM_PROCID": rank}
    return subprocess.Popen([sys.executable, "-c", CHILD, how], env=env, text=True,
                            stdout=subprocess.PIPE)  # fmt: skip


def test_the_folder_names_the_user_job_and_rank_and_a_process_outside_a_job(
    tmp_path: Path,
) -> None:
    mine = folder_for({"SLURM_JOB_ID": "77", "SLURM_PROCID": "3"}, str(tmp_path))
    assert mine == tmp_path / f"slurmtf-tmp-{os.getuid()}-77-rank3"
    outside = folder_for({}, str(tmp_path))
    assert outside.name == f"slurmtf-tmp-{os.getuid()}-pid{os.getpid()}-rank0"


def test_a_rank_that_ends_leaves_nothing(tmp_path: Path) -> None:
    proc = _rank(tmp_path, "end")
    out, _ = proc.communicate(timeout=60)
    folder, made = out.split()
    assert Path(made).parent == Path(folder)  # tempfile wrote into the rank's own folder
    assert proc.returncode == 0
    assert list(tmp_path.iterdir()) == []


def test_a_killed_ranks_files_go_at_its_slots_next_start_and_other_slots_keep_theirs(
    tmp_path: Path,
) -> None:
    with _rank(tmp_path, "wait") as killed, _rank(tmp_path, "wait", rank="0") as other:
        assert killed.stdout is not None
        assert other.stdout is not None  # another rank of the job, still running
        made = killed.stdout.readline().split()[1]
        other_folder, other_made = other.stdout.readline().split()
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert Path(made).exists()  # what a killed rank leaves, as TensorFlow's files
        with _rank(tmp_path, "end") as again:  # the next attempt's rank 1
            again.communicate(timeout=60)
        assert not Path(made).exists()
        assert Path(other_made).exists()  # rank 0's folder is its own
        assert sorted(p.name for p in tmp_path.iterdir()) == [Path(other_folder).name]
        other.kill()
