"""Every way a rank ends x every launch path of a user's script, on the sandbox.

``tests/scripts/rank_ending.py`` ends rank 1 on the job's first attempt by SIGKILL (what
the OOM killer sends), SIGTERM, SIGSEGV, an exception or exit 2, or ends every rank with
75 (preempted after a checkpoint); a restarted attempt exits 0. Each ending runs through
``sbatch jobs/train.sbatch SCRIPT`` (srun sees the script's own process end) and through
``slurmtf submit --command="python SCRIPT"`` (a launcher sits between srun and the
script and exits 128+N for signal N). Both must decide alike, as docs/FAILURES.md says:
a killed rank restarts in place (a new step in the same allocation, Slurm's Restarts
stays 0) and a preemption is requeued, and the job completes with one restart; an
exception or exit 2 are not, and the closing line names the rank's own error line. All
jobs are submitted at once; no TensorFlow, so the whole matrix takes about a minute.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmtf.cluster.ports import free_port_base
from tests.e2e.conftest import PYTHON, REPO, SlurmSandbox

pytestmark = [pytest.mark.slurm]

SCRIPT = REPO / "tests" / "scripts" / "rank_ending.py"
KILLED = "was killed by"
# ending -> (final state, words of the job's closing line)
ENDINGS = {
    "kill": ("COMPLETED", "restart 1 in place (1 of 1 without progress, MAX_RESTARTS), "),
    "term": ("COMPLETED", "restart 1 in place (1 of 1 without progress, MAX_RESTARTS), "),
    "segv": ("COMPLETED", "restart 1 in place (1 of 1 without progress, MAX_RESTARTS), "),
    "preempt": ("COMPLETED", "preempted after saving a checkpoint: requeueing job"),
    "raise": (
        "FAILED",
        "failed: rank 1 failed with its own error (exit code 1): "
        "RuntimeError: rank 1 broke on purpose; not restarted",
    ),
    "exit2": ("FAILED", "failed: bad flags or settings (exit 2): a restart cannot fix them"),
}
PATHS = ("train.sbatch", "submit --command")


def submit(sandbox: SlurmSandbox, root: Path, path: str, ending: str) -> tuple[str, Path]:
    """Submit one job; its id and the folder holding every file it writes."""
    folder = root / f"{path.rsplit(maxsplit=1)[-1].strip('-')}-{ending}"
    folder.mkdir(parents=True)
    env = {"SLURMTF_PORT_BASE": str(free_port_base(2)), "MAX_RESTARTS": "1"}
    if path == "train.sbatch":
        job = sandbox.submit(
            REPO / "jobs" / "train.sbatch", str(SCRIPT), f"--end={ending}",
            sbatch_args=["-N2", "--time=5", f"--output={folder}/job-%j.out"],
            env={**env, "LOG_DIR": str(folder / "logs"), "MODEL_DIR": str(folder / "model")},
        )  # fmt: skip
        return job, folder
    done = sandbox.run(
        [PYTHON, "-m", "slurmtf.submit", f"--command=python3 {SCRIPT} --end={ending}",
         "--nodes=2", "--time=5", "--max_restarts=1", f"--log_dir={folder}"],
        env=env, cwd=folder,
    )  # fmt: skip
    found = re.search(r"submitted job (\d+)", done.stdout)
    assert found, done.stdout + done.stderr
    return found.group(1), folder


@pytest.fixture(scope="module")
def endings(
    slurm_sandbox: SlurmSandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[tuple[str, str], tuple[str, Path]]]:
    root = tmp_path_factory.mktemp("endings")
    jobs = {
        (path, ending): submit(slurm_sandbox, root, path, ending)
        for path in PATHS
        for ending in ENDINGS
    }
    yield jobs
    for job_id, _ in jobs.values():
        slurm_sandbox.run(["scancel", job_id], check=False)


def output_of(folder: Path) -> str:
    return "\n".join(
        p.read_text(errors="replace") for p in sorted(folder.rglob("*")) if p.is_file()
    )


@pytest.mark.matrix
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("ending", ENDINGS)
def test_a_rank_ending_is_handled_alike_on_every_launch_path(
    slurm_sandbox: SlurmSandbox,
    endings: dict[tuple[str, str], tuple[str, Path]],
    path: str,
    ending: str,
) -> None:
    job_id, folder = endings[(path, ending)]
    state, words = ENDINGS[ending]
    final = slurm_sandbox.wait(job_id, timeout=240)
    text = output_of(folder)
    assert final == state, f"{final}\n{text[-4000:]}\n{slurm_sandbox.logs(job_id)}"
    assert words in text, text[-4000:]
    show = slurm_sandbox.run(["scontrol", "show", "job", job_id]).stdout
    # A killed rank restarts in place (Slurm's Restarts stays 0); a preemption requeues.
    restarts = 1 if ending == "preempt" else 0
    assert f"Restarts={restarts} " in show, show
    if state == "COMPLETED" and ending != "preempt":
        sig = {"kill": "SIGKILL", "term": "SIGTERM", "segv": "SIGSEGV"}[ending]
        assert f"after rank 1 was killed by {sig}" in text, text[-4000:]
    if state == "COMPLETED":
        assert text.count("rank 0 attempt 1") == 1, text
        assert text.count("rank 1 attempt 1") == 1, text
    if KILLED in words:  # the closing line never quotes a TensorFlow warning or srun's words
        (line,) = [x for x in text.splitlines() if KILLED in x]
        assert "Exited with exit code" not in line, line
        assert "W0000" not in line, line


FAILING = REPO / "tests" / "scripts" / "failing_progress.py"
# name -> (the script's flags, the job's RESTART_BUDGET, final state, restarts in place)
BUDGETS = {
    "advancing": ((), "progress", "COMPLETED", 4),
    "stuck": (("--stuck",), "progress", "FAILED", 3),
    "advancing, total": ((), "total", "FAILED", 2),
}


@pytest.mark.parametrize("name", BUDGETS)
def test_max_restarts_counts_failures_without_progress(
    slurm_sandbox: SlurmSandbox, tmp_path: Path, name: str
) -> None:
    """``MAX_RESTARTS=2``, rank 1 SIGKILLed on each of the first 4 attempts: a job whose
    every attempt reaches a new step goes past 2 failures and completes; one stuck at the
    step stops after 2 restarts without progress (its first attempt did reach step 10), and
    the advancing one stops after 2 restarts with ``RESTART_BUDGET=total`` (every restart
    counts)."""
    flags, budget, state, restarts = BUDGETS[name]
    env = {"SLURMTF_PORT_BASE": str(free_port_base(2)), "MAX_RESTARTS": "2",
           "RESTART_BUDGET": budget, "LOG_DIR": str(tmp_path / "logs"),
           "MODEL_DIR": str(tmp_path / "model")}  # fmt: skip
    job = slurm_sandbox.submit(
        REPO / "jobs" / "train.sbatch", str(FAILING), "--fails=4", *flags,
        sbatch_args=["-N2", "--time=5", f"--output={tmp_path}/job-%j.out"], env=env,
    )  # fmt: skip
    final = slurm_sandbox.wait(job, timeout=240)
    text = "".join(p.read_text(errors="replace") for p in tmp_path.glob("job-*.out"))
    said = [x for x in text.splitlines() if " in place (" in x]  # the job's log only
    print("MEASURED", name, *said, sep="\n")
    assert final == state, f"{final}\n{text[-4000:]}"
    assert len(said) == restarts, said
    if name == "advancing":
        for n, line in enumerate(said, start=1):
            assert f"restart {n} in place (0 of 2 without progress: training reached step " \
                   f"{10 * n}, MAX_RESTARTS), " in line, line  # fmt: skip
    elif name == "stuck":
        assert "restart 1 in place (0 of 2 without progress: training reached step 10" in said[0]
        assert "restart 2 in place (1 of 2 without progress, MAX_RESTARTS)" in said[1], said
        assert "restart 3 in place (2 of 2 without progress, MAX_RESTARTS)" in said[2], said
        assert "not restarted: already restarted 2 time(s) in a row without progress " \
               "(MAX_RESTARTS=2)" in text, text[-4000:]  # fmt: skip
    else:
        assert "restart 2 of 2 in place (MAX_RESTARTS)" in said[1], said
        assert "not restarted: already restarted 2 time(s) (MAX_RESTARTS=2)" in text, text[-4000:]
    show = slurm_sandbox.run(["scontrol", "show", "job", job]).stdout
    assert "Restarts=0 " in show, show  # every restart in place, none a requeue
