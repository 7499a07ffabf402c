"""What Slurm says of a job, asked once (``scontrol -o show job``): its records, that it
forgot the job, or that the controller did not answer (:mod:`slurmtf.slurm.controller`).

``slurmtf status`` and ``logs`` ask once and hand the answer on, so that a controller
that does not answer costs one ``MessageTimeout``, not one per question, and the job's
record and logs answer instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurmtf.errors import SlurmCommandError
from slurmtf.slurm.controller import Silence, silence_of
from slurmtf.slurm.runner import Runner
from slurmtf.slurm.scontrol import parse_records


def job_records(job_id: str, runner: Runner) -> list[dict[str, str]] | None:
    """``scontrol -o show job`` fields (one record per array task), or ``None`` once Slurm
    forgot the job; raises :class:`SlurmCommandError` for any other error."""
    try:
        text = runner(["scontrol", "-o", "show", "job", job_id])
    except SlurmCommandError as exc:
        if "Invalid job id" in exc.stderr:
            return None
        raise
    return parse_records(text)


@dataclass(frozen=True)
class SlurmView:
    """Slurm's answer about one job: ``records`` (``None`` once it forgot the job, or when
    it did not answer), and when it did not, why (``silent``) and what was asked."""

    records: list[dict[str, str]] | None
    silent: Silence | None = None
    asked: str = ""

    @property
    def record(self) -> dict[str, str] | None:
        """The job's first record, if Slurm answered with one."""
        return self.records[0] if self.records else None

    def note(self) -> str:
        """The one line that says Slurm did not answer ("" when it did)."""
        if self.silent is None:
            return ""
        return (
            f"Slurm did not answer (`{self.asked}`: {self.silent.words}); shown from the "
            f"job's record and logs. HINT: {self.silent.hint()}"
        )


def ask_slurm(job_id: str, runner: Runner) -> SlurmView:
    """Ask ``scontrol`` once about ``job_id``; a controller that does not answer (or no
    configuration on this machine) is an answer too. Other errors are raised."""
    try:
        return SlurmView(job_records(job_id, runner))
    except SlurmCommandError as exc:
        found = silence_of(exc)
        if found is None:
            raise
        return SlurmView(None, found, exc.command)
