"""``scontrol -o show job`` as each Slurm release prints it (captured on the sandbox:
22.05.8 Debian, 26.05.3 built from SchedMD's tag): the fields slurmtf reads, the
``SubmitLine=`` of 25.11+ (a running job's --nodes range), 26.05's sorted ``NodeList``
and ``FailedNode=``. docs/SLURM_VERSIONS.md. No Slurm, no TF."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from slurmtf.cli.recovery import range_minimum
from slurmtf.errors import SlurmCommandError
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
