"""Which line of a rank's stderr says what went wrong: ``slurmtf.contracts.rank_error_line``,
the one definition that ``slurmtf status``, the sweep table, the console and the job's end
(the supervisor, tests/test_supervisor.py) read a rank with."""

from __future__ import annotations

import pytest

from slurmtf.contracts import is_error_line, rank_error_line

WARNINGS = (
    "W0000 00:00:1764070000.1 123 dataset.cc:997] Input will not be optimized\n"
    "2026-11-25 13:00:00.123456: W tensorflow/core/x.cc:1] a warning\n"
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
)


@pytest.mark.parametrize(
    ("text", "line", "failed_line"),
    [
        ("Traceback:\n  x\nAssertionError: diverged\nsrun: error: node1: task 0: Exited\n",
         "AssertionError: diverged", "AssertionError: diverged"),
        ("models.mnist: --lr=-1: is negative. HINT: positive\n" + WARNINGS,
         "models.mnist: --lr=-1: is negative. HINT: positive",
         "models.mnist: --lr=-1: is negative. HINT: positive"),
        ("tensorflow.python.framework.errors_impl.UnavailableError: lost\n  \n",
         "tensorflow.python.framework.errors_impl.UnavailableError: lost",
         "tensorflow.python.framework.errors_impl.UnavailableError: lost"),
        ("W0000 noise\nsrun: error: node1: task 0: Killed\n",
         "srun: error: node1: task 0: Killed", "srun: error: node1: task 0: Killed"),
        ("usage: slurmtf [-h]\nslurmtf: error: unrecognized arguments: --x\n",
         "slurmtf: error: unrecognized arguments: --x",
         "slurmtf: error: unrecognized arguments: --x"),
        ("I0000 all fine\n", "", "I0000 all fine"),
        ("py: cannot open 'x'\n" + WARNINGS, "", "py: cannot open 'x'"),
        ("", "", ""),
    ],
)  # fmt: skip
def test_a_ranks_own_words_first_then_slurms_then_for_a_failed_rank_its_last_line(
    text: str, line: str, failed_line: str
) -> None:
    assert rank_error_line(text) == line
    assert rank_error_line(text, failed=True) == failed_line


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("ValueError: bad shape (3, 4)", True),
        ("  KeyboardInterrupt", True),
        ("slurmstepd-node1: error: *** STEP 5.0 CANCELLED ***", True),
        ("x: --batch_size='7': does not divide. HINT: use 8", True),
        ("13:04:54 rank0 I step 5/20 loss 1.2580", False),
        ('  File "train.py", line 3, in <module>', False),
        ("W0000 00:00:1.1 1 x.cc:1] an Error in the words", False),
    ],
)
def test_is_error_line(line: str, error: bool) -> None:
    assert is_error_line(line) is error
