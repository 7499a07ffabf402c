"""Staging a data set to node-local scratch: one verified copy per node, per job.

``slurmtf data stage SRC`` runs once on every node of a job (the job's supervisor,
:mod:`slurmtf.runtime.job.staging`, starts it with one task per node) and copies the files
``SRC/MANIFEST.json`` lists to ``ROOT/slurmtf-data-<job id>/<name of SRC>``, where ROOT is
``$STAGE_DIR``, ``$SLURM_TMPDIR``, ``$TMPDIR`` or ``/tmp`` (the first set). The copy is
written beside its final name, checked against the manifest's SHA-256 sums, then renamed
into place with a marker holding the manifest's digest: a requeued job on the same node
finds the marker and reuses the copy. ``slurmtf data unstage SRC`` removes the job's copy.

The training processes learn of the copy through ``SLURMTF_STAGED_DATA=SRC`` (exported by
the job script): :func:`resolve_data_dir` turns ``--data_dir=SRC`` into this node's copy
(the models), :func:`staged_args` does it to a script's arguments (slurmtf.run).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from slurmtf.datasets import manifest
from slurmtf.errors import InputError

STAGED_ENV = "SLURMTF_STAGED_DATA"
ROOT_VARS = ("STAGE_DIR", "SLURM_TMPDIR", "TMPDIR")
MARKER = ".slurmtf-verified"
COPY_THREADS = 4  # files copied at once on one node (bounded)


@dataclasses.dataclass(frozen=True)
class Staged:
    """The outcome of staging on one node."""

    path: Path
    reused: bool
    bytes: int
    seconds: float


def stage_root(environ: Mapping[str, str]) -> Path:
    """This node's scratch: ``$STAGE_DIR``, ``$SLURM_TMPDIR``, ``$TMPDIR`` or ``/tmp``."""
    for name in ROOT_VARS:
        if environ.get(name):
            return Path(environ[name])
    return Path("/tmp")


def job_dir(environ: Mapping[str, str]) -> Path:
    """The folder holding this job's staged copies on this node."""
    job = environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID")
    name = (
        f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
        if job
        else environ.get("SLURM_JOB_ID", "local")
    )
    return stage_root(environ) / f"slurmtf-data-{name}"


def local_path(src: str | Path, environ: Mapping[str, str]) -> Path:
    """Where ``src`` is staged on this node."""
    return job_dir(environ) / Path(src).resolve().name


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _listed(src: Path) -> tuple[dict[str, str], str]:
    """The manifest's files (relative path -> sha256) and the manifest's own digest."""
    path = src / manifest.NAME
    if not path.is_file():
        raise InputError(
            "STAGE_DATA",
            str(src),
            f"has no {manifest.NAME}, so a copy cannot be verified",
            "write it with `slurmtf data sample-mnist|fetch`, or leave STAGE_DATA unset",
        )
    record = manifest.load(path)
    files = {rel: entry["sha256"] for rel, entry in record["files"].items()}
    return files, hashlib.sha256(path.read_bytes()).hexdigest()


def check_space(root: Path, needed: int, src: Path) -> None:
    """One error line naming ``root``, the space needed and the space free."""
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if free < needed:
        raise InputError(
            "STAGE_DIR",
            str(root),
            f"has {human(free)} free, staging {src} needs {human(needed)}",
            "set STAGE_DIR to a node-local disk with room, or leave STAGE_DATA unset "
            "to read in place",
        )


def _copy_one(src: Path, tmp: Path, rel: str, expected: str) -> int:
    target = tmp / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / rel, target)
    actual = manifest.sha256_file(target)
    if actual != expected:
        raise InputError(
            str(src / rel),
            f"sha256:{actual[:16]}...",
            f"does not match {src / manifest.NAME} (sha256:{expected[:16]}...)",
            "the data set is damaged or was replaced; write or fetch it again",
        )
    return target.stat().st_size


def stage(src: str | Path, environ: Mapping[str, str]) -> Staged:
    """Copy and verify ``src`` on this node (or reuse this job's verified copy)."""
    src = Path(src).resolve()
    files, digest = _listed(src)
    dest = local_path(src, environ)
    marker = dest / MARKER
    if marker.is_file() and marker.read_text().strip() == digest:
        return Staged(dest, True, 0, 0.0)
    missing = [rel for rel in files if not (src / rel).is_file()]
    if missing:
        raise InputError(
            str(src / missing[0]), "(missing)", f"is listed in {src / manifest.NAME}",
            "write or fetch the data set again",
        )  # fmt: skip
    needed = sum((src / rel).stat().st_size for rel in files)
    check_space(dest.parent, needed, src)
    start = time.monotonic()
    tmp = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with ThreadPoolExecutor(COPY_THREADS) as pool:
            sizes = list(pool.map(lambda rel: _copy_one(src, tmp, rel, files[rel]), files))
        shutil.copyfile(src / manifest.NAME, tmp / manifest.NAME)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.replace(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    (dest / MARKER).write_text(digest + "\n")
    return Staged(dest, False, sum(sizes), time.monotonic() - start)


def unstage(environ: Mapping[str, str]) -> Path:
    """Remove this job's staged copies on this node; returns the folder removed."""
    folder = job_dir(environ)
    shutil.rmtree(folder, ignore_errors=True)
    return folder


def resolve_data_dir(data_dir: str | None, environ: Mapping[str, str]) -> str | None:
    """This node's verified copy when the job staged ``data_dir``, else ``data_dir``."""
    staged = environ.get(STAGED_ENV)
    if not data_dir or not staged or Path(staged).resolve() != Path(data_dir).resolve():
        return data_dir
    copy = local_path(staged, environ)
    if not (copy / MARKER).is_file():
        raise InputError(
            STAGED_ENV,
            staged,
            f"has no verified copy on this node at {copy}",
            "stage it first (STAGE_DATA=1, the supervisor stages it) or unset " + STAGED_ENV,
        )
    return str(copy)


def staged_args(args: Sequence[str], environ: Mapping[str, str]) -> tuple[str, ...]:
    """``args`` with ``--data_dir=SRC`` and ``--data_dir SRC`` (up to a ``--``) naming
    this node's verified copy when the job staged SRC; unchanged otherwise."""
    out = list(args)
    if not environ.get(STAGED_ENV):
        return tuple(out)
    for i, arg in enumerate(out):
        if arg == "--":
            break
        if arg.startswith("--data_dir="):
            out[i] = f"--data_dir={resolve_data_dir(arg.partition('=')[2], environ) or ''}"
        elif i and args[i - 1] == "--data_dir":
            out[i] = resolve_data_dir(arg, environ) or arg
    return tuple(out)
