"""The one error family of slurmtf: every message names the input, its value and a fix."""

from __future__ import annotations


class SlurmtfError(Exception):
    """Base class of every error slurmtf raises on purpose."""


class InputError(SlurmtfError, ValueError):
    """A variable, flag or argument has a bad value.

    The message reads ``NAME='value': problem. HINT: fix`` so that one line on
    stderr tells the user what to change.
    """

    def __init__(self, name: str, value: object, problem: str, hint: str) -> None:
        self.name = name
        self.value = value
        self.problem = problem
        self.hint = hint
        super().__init__(f"{name}={value!r}: {problem}. HINT: {hint}")


class SlurmCommandError(SlurmtfError, RuntimeError):
    """A Slurm command (sbatch, squeue, scontrol, ...) failed; carries its own message."""

    def __init__(self, command: str, returncode: int, stderr: str) -> None:
        self.command = command
        self.returncode = returncode
        self.stderr = stderr.strip()
        super().__init__(f"{command} failed (exit {returncode}): {self.stderr or 'no message'}")
