"""One small subprocess runner, passed in wherever slurmtf calls a Slurm command.

Tests hand a fake :class:`Runner` (any callable with the same signature) instead of
patching ``subprocess``; the end-to-end tests use :data:`default_runner`.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from typing import Protocol

from slurmtf.errors import SlurmCommandError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 60.0


class Runner(Protocol):
    """Runs a command and returns its stdout, or raises :class:`SlurmCommandError`."""

    def __call__(
        self,
        args: Sequence[str],
        *,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        check: bool = True,
    ) -> str: ...


class SubprocessRunner:
    """The real runner: ``subprocess.run`` with a timeout and text output."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout = timeout

    def __call__(
        self,
        args: Sequence[str],
        *,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        check: bool = True,
    ) -> str:
        command = shlex.join(args)
        limit = self.timeout if timeout is None else timeout
        log.debug("running %s", command)
        try:
            done = subprocess.run(
                list(args),
                input=input,
                env=None if env is None else dict(env),
                capture_output=True,
                text=True,
                timeout=limit,
                check=False,
            )
        except FileNotFoundError as exc:
            raise SlurmCommandError(command, 127, f"{args[0]}: command not found") from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmCommandError(command, 124, f"timed out after {limit:g} s") from exc
        if check and done.returncode != 0:
            raise SlurmCommandError(command, done.returncode, done.stderr or done.stdout)
        return done.stdout


default_runner: Runner = SubprocessRunner()
