"""Staging a data set on every node before training (``STAGE_DATA=1``, ``slurmtf data
stage``) and removing the copies at the end: slurmtf's own steps, run outside any
container prefix with the supervisor's interpreter.

STAGE_DATA=1: each node copies the data set SRC once (one task per node) to its local
scratch ($STAGE_DIR, $SLURM_TMPDIR or $TMPDIR) and verifies it against
SRC/MANIFEST.json. SRC is the last ``--data_dir=DIR`` or ``--data_dir DIR`` of the job
script's arguments, else DATA_DIR. The ranks read that copy (``SLURMTF_STAGED_DATA=SRC``
turns ``--data_dir=SRC`` into it). A bad or missing file, or too little space, is one
line and exit 2 before training. The copy is removed when the job ends and kept when it
is requeued, so that a restart on the same node reuses it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurmtf.datasets.stage import STAGED_ENV
from slurmtf.errors import InputError
from slurmtf.runtime.job.children import run_bounded
from slurmtf.runtime.job.commands import data_source, own_command
from slurmtf.runtime.job.settings import JobSettings, JobStop
from slurmtf.runtime.job_log import log
from slurmtf.runtime.slurm_calls import per_node_step
from slurmtf.slurm.runner import Runner

STAGE_TIMEOUT_S = 6 * 3600.0
UNSTAGE_TIMEOUT_S = 600.0


class Staging:
    def __init__(self, job: JobSettings, env: Mapping[str, str], runner: Runner) -> None:
        self.job, self.base_env, self.runner = job, dict(env), runner
        self.source = ""  # the staged data set, once staged
        self.python = sys.executable  # slurmtf's own interpreter (the supervisor's)

    def env(self) -> dict[str, str]:
        return {STAGED_ENV: self.source} if self.source else {}  # SLURMTF_STAGED_DATA

    def own(self, *args: str) -> list[str]:
        """A command of slurmtf's own: the supervisor's interpreter, no container."""
        return own_command(self.python, *args)

    def per_node(self) -> list[str]:
        return per_node_step(self.job.num_nodes)

    def stage(self, args: Sequence[str]) -> None:
        if not self.job.stage:
            return
        src = (
            data_source(self.job.data_dir, args)
            if self.job.kind != "submitit"
            else self.job.data_dir
        )
        if not src:
            raise InputError(
                "STAGE_DATA", "1", "names no data set to stage",
                "set DATA_DIR, or pass --data_dir=DIR to the model or script, a folder "
                "with a MANIFEST.json",
            )  # fmt: skip
        src = str(Path(src) if Path(src).is_absolute() else Path.cwd() / src)
        err = self.job.log_dir / f"stage-{self.job.job_id}.err"
        start = time.monotonic()
        log(f"staging {src} to the local scratch of {self.job.num_nodes} node(s)")
        command = [
            *self.per_node(),
            "--kill-on-bad-exit=1",
            f"--error={err}",
            *self.own("data", "stage", src),
        ]
        if run_bounded(command, self.base_env, STAGE_TIMEOUT_S) != 0:
            said = [x for x in _text(err).splitlines() if x.startswith("slurmtf data stage: ")]
            self.source = src
            self.unstage()
            raise JobStop(f"not training: {said[-1] if said else f'staging failed, see {err}'}")
        log(f"staged {src} on {self.job.num_nodes} node(s) in {time.monotonic() - start:.0f} s")
        self.source = src

    def unstage(self) -> None:
        """Remove this job's staged copies from every node's scratch (none: nothing)."""
        if not self.source:
            return
        command = [*self.per_node(), "--output=/dev/null", *self.own("data", "unstage")]
        if run_bounded(command, self.base_env, UNSTAGE_TIMEOUT_S) != 0:
            log(f"could not remove the staged copies of {self.source}", error=True)
        self.source = ""


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
