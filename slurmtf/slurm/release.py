"""Which Slurm release a cluster runs, and what each release accepts: the one home of
slurmtf's knowledge of Slurm versions.

:class:`SlurmRelease` is parsed from what Slurm's commands print for ``--version``
(``slurm 26.05.3``, Debian's ``slurm-wlm 22.05.8``); :func:`installed_release` asks a
command through the runner. The constants below name the first release with each
behaviour slurmtf depends on; code asks ``release >= SOMETHING`` instead of comparing
numbers of its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurmtf.errors import InputError
from slurmtf.slurm.runner import Runner

_VERSION = re.compile(r"(?:^|[\s-])(\d{2})\.(\d{2})\.(\d+)")


@dataclass(frozen=True, order=True)
class SlurmRelease:
    """A Slurm release as year.month.micro (``26.05.3``); ordered by age."""

    year: int
    month: int
    micro: int = 0

    @classmethod
    def parse(cls, text: str, name: str = "slurm --version") -> SlurmRelease:
        """``slurm 26.05.3``, ``slurm-wlm 22.05.8``, ``26.05.3`` or ``slurm 25.11.0-rc1``."""
        match = _VERSION.search(text.strip())
        if match is None:
            raise InputError(
                name,
                text.strip()[:80],
                "names no Slurm release YY.MM.N",
                "pass what `sinfo --version` prints, e.g. 'slurm 26.05.3'",
            )
        year, month, micro = (int(part) for part in match.groups())
        return cls(year, month, micro)

    def __str__(self) -> str:
        return f"{self.year:02d}.{self.month:02d}.{self.micro}"

    @property
    def series(self) -> str:
        """``26.05``: the release series SchedMD supports as one."""
        return f"{self.year:02d}.{self.month:02d}"


# The first release of each behaviour code branches on (Slurm's NEWS and source). What
# differs without a branch (every release read the same way) is in docs/SLURM_VERSIONS.md.
DEBIAN_12 = SlurmRelease(22, 5, 8)
# cgroup.conf ``CgroupPlugin=disabled``: a node may run without the cgroup plugin.
CGROUP_PLUGIN_DISABLED = SlurmRelease(24, 5)
# sacct reports an exit code above 128 as it is (before: 128 subtracted).
SACCT_EXIT_ABOVE_128 = SlurmRelease(25, 11)
# slurmstepd tries a task's exit message to its srun 5 times, not 6 (MessageTimeout each).
FIVE_TASK_EXIT_TRIES = SlurmRelease(25, 11)
# slurmstepd arms the unkillable-step timer at a terminate request only for a step not yet
# cancelled (before: at every one, also after its tasks ended, which drained the node).
TERMINATE_MONITOR_CHECKED = SlurmRelease(26, 5)


def installed_release(runner: Runner, command: str = "sinfo") -> SlurmRelease:
    """The release the Slurm ``command`` (a name on PATH or a path) belongs to.

    Client commands need a configuration even for their version; a daemon
    (``slurmctld``, ``slurmd``) answers ``-V`` without one."""
    out = runner([command, "-V"], timeout=15)
    return SlurmRelease.parse(out, f"{command} -V")
