"""A fake Slurm for unit tests: answers commands from a table through slurmtf's runner."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from slurmtf.errors import SlurmCommandError


class FakeSlurm:
    """Answers Slurm commands from a table; records every call."""

    def __init__(self, answers: dict[str, list[tuple[int, str, str]]]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str], **_: object) -> str:
        self.calls.append(list(args))
        queue = self.answers.get(args[0], [(0, "", "")])
        code, out, err = queue.pop(0) if len(queue) > 1 else queue[0]
        if code:
            raise SlurmCommandError(shlex.join(args), code, err)
        return out


def scontrol(state: str, code: str = "0:0") -> tuple[int, str, str]:
    """``scontrol -o show job 7`` output for a job in ``state``."""
    return (0, f"JobId=7 JobName=x JobState={state} Reason=None ExitCode={code} RunTime=1\n", "")


GONE = (1, "", "slurm_load_jobs error: Invalid job id specified")
NO_ACCT = (1, "", "sacct: error: Slurm accounting storage is disabled")
