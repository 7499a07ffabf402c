"""``CHECK_FIRST=1``: ``slurmtf check`` over the job's nodes before training
(docs/CHECK.md), slurmtf's own command, run outside any container prefix with the
supervisor's interpreter. Its outlier nodes go to the decision
(:func:`slurmtf.runtime.recovery.decision.after_check`: left out in place, or a requeue
without them).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping

from slurmtf.runtime.job.children import run_bounded
from slurmtf.runtime.job.commands import own_command
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.runtime.job_log import log

CHECK_TIMEOUT_S = 3600.0


class CheckFirst:
    def __init__(self, job: JobSettings, env: Mapping[str, str]) -> None:
        self.job, self.base_env = job, dict(env)
        self.python = sys.executable  # slurmtf's own interpreter (the supervisor's)

    def outliers(self, attempt: int) -> tuple[str, ...]:
        """``slurmtf check`` over the job's nodes: its outlier nodes (none when healthy,
        or when the check could not run: then training goes ahead)."""
        report = self.job.log_dir / f"check-{self.job.job_id}-{attempt}.json"
        command = own_command(self.python, "check", f"--json={report}")
        rc = run_bounded(command, self.base_env, CHECK_TIMEOUT_S)
        if rc == 0:
            return ()
        try:
            outliers = json.loads(report.read_text())["outliers"]
            bad = sorted({str(o["node"]) for o in outliers})
        except (OSError, ValueError, KeyError, TypeError):
            bad = []
        if rc != 1 or not bad:
            log(f"check_first: the check did not run (exit {rc}); training anyway", error=True)
            return ()
        return tuple(bad)
