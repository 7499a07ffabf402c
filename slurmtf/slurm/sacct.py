"""``sacct``'s ``ExitCode`` as each Slurm release prints it (pure).

``scontrol show job`` prints a job's ``ExitCode=N:S`` as the job ended on every release
(a batch script that exits 137 is ``137:0``). ``sacct`` did too for codes up to 128, but
before Slurm 25.11 it took 128 off an exit code above 128 (``src/sacct/print.c``: ``if
(tmp_int >= 128) tmp_int -= 128``; 25.11: "Don't subtract 128 from sacct returned exit
codes for the codes above 128"): that job was ``9:0``, the same as a job that exited 9.

:func:`render_exit_code` writes a code as a release's sacct does (the sandbox's stand-in
``sacct``); :func:`read_exit_code` reads one back as the job ended, given the release and,
when there is one, the status the job is known to have ended with (slurmtf's job scripts
record it), which tells 9 from 137 on releases before 25.11.
"""

from __future__ import annotations

from slurmtf.errors import InputError, SlurmCommandError
from slurmtf.slurm.release import SACCT_EXIT_ABOVE_128, SlurmRelease, installed_release
from slurmtf.slurm.runner import Runner


def split_exit_code(text: str) -> tuple[int, int] | None:
    """``N:S`` -> ``(N, S)``; ``None`` when it is not two numbers."""
    code, sep, sig = text.strip().partition(":")
    if not (sep and code.isdigit() and sig.isdigit()):
        return None
    return int(code), int(sig)


def takes_128_off(release: SlurmRelease | None) -> bool:
    """True for a release whose sacct reports exit codes above 128 less 128 (before 25.11);
    an unknown release is taken to report them as they are."""
    return release is not None and release < SACCT_EXIT_ABOVE_128


def render_exit_code(text: str, release: SlurmRelease | None) -> str:
    """An exit code as the job ended (``137:0``, as scontrol prints it) the way ``release``'s
    sacct prints it: ``9:0`` before 25.11, ``137:0`` from 25.11."""
    pair = split_exit_code(text)
    if pair is None or not takes_128_off(release) or pair[0] < 128:
        return text
    return f"{pair[0] - 128}:{pair[1]}"


def read_exit_code(text: str, release: SlurmRelease | None, known: int | None = None) -> str:
    """sacct's ``N:S`` of ``release`` as the job ended. Before 25.11 a code N below 128 may
    have been N+128; ``known`` (the status the job is recorded to have ended with) decides
    when it says so, else the code stays as sacct printed it."""
    pair = split_exit_code(text)
    if pair is None or not takes_128_off(release) or known is None:
        return text
    code, sig = pair
    if known >= 128 and known - 128 == code:
        return f"{known}:{sig}"
    return text


def accounting_states(
    job_id: str, runner: Runner, known: int | None = None
) -> list[tuple[str, str]] | None:
    """``sacct`` states and exit codes of the job's allocations, or ``None`` without
    accounting. With ``known`` (the status the job's record says it ended with) a code
    that sacct before 25.11 printed less 128 is read back as the job ended; the release
    is asked (``sacct --version``) only then."""
    try:
        text = runner(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,ExitCode"])
    except SlurmCommandError:
        return None
    if not text.strip():
        return None
    rows = [line.split("|") for line in text.strip().splitlines()]
    states = [(row[1], row[2]) for row in rows if len(row) >= 3]
    codes = {c.partition(":")[0] for _, c in states}
    if known is None or known < 128 or str(known - 128) not in codes:
        return states  # nothing that sacct before 25.11 may have printed less 128
    try:
        release = installed_release(runner, "sacct")
    except (SlurmCommandError, InputError):
        return states
    return [(s, read_exit_code(c, release, known)) for s, c in states]
