"""A rank's own temporary folder, so that a killed rank's files go with its slot.

TensorFlow's AutoGraph writes each converted function as ``__autograph_generated_file*.py``
in the temporary folder and removes the files at interpreter exit, which a killed rank
never reaches: measured, about 15 files per killed MNIST rank, left in ``$TMPDIR`` for
every failure of a long job (benchmarks/soak_failures.py). :func:`use_own` points this
process's :mod:`tempfile` at one folder per user, job and rank, empties what the slot's
previous process left there, and removes the folder at exit. Set once the previous
attempt's step has ended (a cold start, or a warm rank's go), never while it may run.
``$TMPDIR`` itself is left as it is for the process's children.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path


def folder_for(environ: Mapping[str, str], root: str | None = None) -> Path:
    """``<temporary folder>/slurmtf-tmp-<uid>-<job>-rank<R>``; outside a job, one of this
    process's own (``pid<PID>``), never shared with another run."""
    job = environ.get("SLURM_JOB_ID") or f"pid{os.getpid()}"
    rank = environ.get("SLURM_PROCID") or "0"
    base = root or tempfile.gettempdir()
    return Path(base) / f"slurmtf-tmp-{os.getuid()}-{job}-rank{rank}"


def use_own(environ: Mapping[str, str]) -> Path:
    """Make :func:`folder_for` this process's temporary folder (emptied first), removed at
    exit; the folder."""
    folder = folder_for(environ)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    tempfile.tempdir = str(folder)
    # Registered before TensorFlow's own handlers, so it runs after them (last in, first out).
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder
