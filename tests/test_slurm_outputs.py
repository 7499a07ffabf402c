"""``scontrol -o show job`` and ``sacct`` as each Slurm release prints them (scontrol
captured on the sandbox: 22.05.8 Debian, 26.05.3 built from SchedMD's tag): the fields
slurmtf reads, the ``SubmitLine=`` of 25.11+ (a running job's --nodes range), 26.05's
sorted ``NodeList`` and ``FailedNode=``, sacct's exit codes above 128 (less 128 before
25.11). docs/SLURM_VERSIONS.md. No Slurm, no TF."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from slurmtf.errors import SlurmCommandError
from slurmtf.monitor.status import state_line
from slurmtf.runtime.slurm_calls import range_minimum
from slurmtf.sandbox import sacct as sandbox_sacct
from slurmtf.slurm.release import SlurmRelease
from slurmtf.slurm.sacct import read_exit_code, render_exit_code
from slurmtf.slurm.scontrol import parse_records, submit_line_nodes

# `sbatch --parsable --nodes=1-2 --gres=none -o /dev/null --wrap 'sleep 20 a=b'` (job 41)
DATA = Path(__file__).parent / "data"
SHOW_JOB = {v: (DATA / f"scontrol-show-job-{v}.txt").read_text() for v in ("22.05", "26.05")}


@pytest.mark.parametrize("version", SHOW_JOB)
def test_the_fields_slurmtf_reads_on_every_release(version: str) -> None:
    (job,) = parse_records(SHOW_JOB[version])
    assert job["JobId"] == "41"
    assert job["JobState"] == "FAILED"
    assert job["ExitCode"] == "1:0"
    assert job["NodeList"] == "node[1-2]"
    assert job["ExcNodeList"] == "(null)"
    assert job["WorkDir"] == "/tmp/h39-jobs"
    assert job["StdOut"] == "/dev/null"
    # The submitted words are no fields: not --nodes, not the wrapped command's a=b.
    assert not {"--nodes", "a", "-o"} & set(job)


def test_the_submit_line_of_25_11_and_later_keeps_its_words() -> None:
    (job,) = parse_records(SHOW_JOB["26.05"])
    assert job["SubmitLine"] == (
        "sbatch --parsable --nodes=1-2 --gres=none -o /dev/null --wrap sleep 20 a=b"
    )
    assert "SubmitLine" not in parse_records(SHOW_JOB["22.05"])[0]


def test_a_submit_line_cannot_pass_for_a_field() -> None:
    line = "JobId=5 JobState=RUNNING SubmitLine=sbatch train.sbatch JobState=X WorkDir=/w"
    (job,) = parse_records(line)
    assert job["JobState"] == "RUNNING"
    assert job["SubmitLine"] == "sbatch train.sbatch JobState=X"
    assert job["WorkDir"] == "/w"


def test_26_05_sorted_node_list_and_failed_node_are_read_as_they_are() -> None:
    """26.05 sorts NodeList (Slurm's hostlist order) and adds FailedNode=: both read as
    printed; a node list from scontrol is a set of names, never the ranks' order."""
    line = "JobId=6 Reason=None FailedNode=node3 Dependency=(null) NodeList=node[1-2,4]"
    (job,) = parse_records(line)
    assert job["FailedNode"] == "node3"
    assert job["NodeList"] == "node[1-2,4]"


@pytest.mark.parametrize(
    ("line", "nodes"),
    [
        ("sbatch --parsable --nodes=2-3 jobs/mnist.sbatch --train_steps=9", (2, 3)),
        ("sbatch --nodes 2-4 mnist.sbatch", (2, 4)),
        ("sbatch -N 2-3 jobs/mnist.sbatch", (2, 3)),
        ("sbatch -N2-3 jobs/mnist.sbatch", (2, 3)),
        ("sbatch -N3 jobs/mnist.sbatch", (3, 3)),
        ("sbatch jobs/mnist.sbatch --nodes=2-3", None),  # the model's argument, not sbatch's
        ("sbatch jobs/mnist.sbatch", None),  # #SBATCH --nodes=2 is not in the line
        ("sbatch --wrap srun -N 2-3 x", None),
        ("sbatch --nodes=3-2 x.sbatch", None),
        ("sbatch --nodes=x x.sbatch", None),
        ("", None),
    ],
)
def test_submit_line_nodes(line: str, nodes: tuple[int, int] | None) -> None:
    assert submit_line_nodes(line) == nodes


def _scontrol(text: str | None) -> object:
    def runner(args: Sequence[str], **_: object) -> str:
        assert list(args) == ["scontrol", "-o", "show", "job", "41"]
        if text is None:
            raise SlurmCommandError("scontrol", 1, "Unable to contact slurm controller")
        return text

    return runner


@pytest.mark.parametrize(
    ("submit", "allocated", "minimum"),
    [
        ("sbatch --nodes=2-3 jobs/mnist.sbatch", 3, "2"),  # 25.11+: the range's minimum
        ("sbatch --nodes=2-3 jobs/mnist.sbatch", 2, ""),  # got the minimum: no fewer
        ("sbatch -N3 jobs/mnist.sbatch", 3, ""),
        (None, 3, ""),  # 22.05 to 25.05: no SubmitLine
    ],
)
def test_a_ranges_minimum_from_scontrol(submit: str | None, allocated: int, minimum: str) -> None:
    line = "JobId=41 JobState=RUNNING NumNodes=3 Command=x"
    if submit is not None:
        line += f" SubmitLine={submit} WorkDir=/w"
    assert range_minimum("41", allocated, _scontrol(line)) == minimum  # type: ignore[arg-type]


def test_no_minimum_when_scontrol_does_not_answer() -> None:
    assert range_minimum("41", 3, _scontrol(None)) == ""  # type: ignore[arg-type]
    assert range_minimum("local", 3, _scontrol(None)) == ""  # type: ignore[arg-type]


# --- sacct's ExitCode: before 25.11 an exit code above 128 less 128 -----------------------

R22, R25, R26 = SlurmRelease(22, 5, 8), SlurmRelease(25, 11, 7), SlurmRelease(26, 5, 3)


@pytest.mark.parametrize(
    ("ended", "release", "printed"),
    [
        ("137:0", R22, "9:0"),
        ("128:0", R22, "0:0"),
        ("127:0", R22, "127:0"),
        ("0:9", R22, "0:9"),  # a signal is its own field
        ("137:0", R25, "137:0"),
        ("137:0", R26, "137:0"),
        ("137:0", None, "137:0"),
    ],
)
def test_the_sandbox_sacct_prints_exit_codes_as_its_release_does(
    ended: str, release: SlurmRelease | None, printed: str
) -> None:
    assert render_exit_code(ended, release) == printed
    rows = sandbox_sacct.as_release_prints([{"JobID": "7", "ExitCode": ended}], release)
    assert rows == [{"JobID": "7", "ExitCode": printed}]


@pytest.mark.parametrize(
    ("printed", "release", "known", "ended"),
    [
        ("9:0", R22, 137, "137:0"),  # the job's record says 137: 9 was 137
        ("9:0", R22, 9, "9:0"),
        ("9:0", R22, None, "9:0"),  # nothing tells: as printed
        ("137:0", R26, 137, "137:0"),
        ("9:0", R26, 137, "9:0"),  # 25.11+ prints what it has
    ],
)
def test_sacct_exit_codes_read_back_as_the_job_ended(
    printed: str, release: SlurmRelease, known: int | None, ended: str
) -> None:
    assert read_exit_code(printed, release, known) == ended


@pytest.mark.parametrize(
    ("version", "printed"), [("slurm-wlm 22.05.8", "9:0"), ("slurm 26.05.3", "137:0")]
)
def test_status_of_a_forgotten_job_reads_sacct_of_either_release(
    version: str, printed: str, tmp_path: Path
) -> None:
    """A job killed for the last time (its script exited 137, recorded as a stop) and no
    longer known to scontrol: `slurmtf status` says exit 137 on every release."""
    (tmp_path / "recovery-7.jsonl").write_text('{"action": "stop", "status": 137}\n')

    def runner(args: Sequence[str], **_: object) -> str:
        if args[0] == "scontrol":
            raise SlurmCommandError("scontrol", 1, "slurm_load_jobs error: Invalid job id")
        if list(args[1:]) in (["--version"], ["-V"]):
            return version + "\n"
        return f"7|FAILED|{printed}\n"

    line, status = state_line("7", runner, tmp_path)
    assert status == 137, line
    assert line == "job 7: FAILED (exit 137:0) [sacct]"
