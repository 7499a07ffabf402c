"""Data-set manifests: SHA-256 of every file, where the data came from, its licence.

A manifest is ``MANIFEST.json`` in the data directory (the directory ``--data_dir``
names, or the parent of the folder holding the files, as for ``cifar-10-batches-bin``).
Readers call :func:`verify` on the files they are about to read: without a manifest it
does nothing; with one, a file it does not list or whose bytes differ is an
:class:`~slurmtf.errors.InputError`. Every file is written atomically (a temporary file
in the same directory, fsynced, then renamed), so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from slurmtf.errors import InputError

NAME = "MANIFEST.json"
FORMAT = "slurmtf-data-manifest/1"
_CHUNK = 1 << 20
# (resolved path, size, mtime_ns) -> sha256: a process that reads a split twice (its
# example count, then its data) hashes it once.
_DIGESTS: dict[tuple[str, int, int], str] = {}


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What a data directory holds: ``files`` maps a relative path to its SHA-256."""

    name: str
    description: str
    source: str
    licence: str
    files: dict[str, str]
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> str:
        record = {
            "format": FORMAT,
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "licence": self.licence,
            **self.extra,
            "files": {k: {"sha256": v} for k, v in sorted(self.files.items())},
        }
        return json.dumps(record, indent=2) + "\n"


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks (cached per size and mtime)."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(_CHUNK), b""):
                digest.update(chunk)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


@contextlib.contextmanager
def atomic_open(path: str | Path) -> Iterator[IO[bytes]]:
    """A binary file that appears at ``path`` complete, or not at all.

    Writes go to a hidden temporary file beside ``path``; on success it is flushed,
    fsynced and renamed over ``path``; on any exception it is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # as open() would: readable by the job's nodes
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, chunks: bytes | Iterable[bytes]) -> None:
    """Write ``chunks`` (bytes or an iterable of them) to ``path`` atomically."""
    with atomic_open(path) as handle:
        for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
            handle.write(chunk)


def write(directory: str | Path, manifest: Manifest) -> Path:
    """Write ``MANIFEST.json`` into ``directory`` (atomically); returns its path."""
    path = Path(directory) / NAME
    atomic_write(path, manifest.to_json().encode())
    return path


def find(path: str | Path) -> Path | None:
    """The manifest covering ``path``: in its directory, or in the parent directory when
    that one lists files of this folder (``cifar-10-batches-bin/...``)."""
    folder = Path(path).parent
    if (folder / NAME).is_file():
        return folder / NAME
    parent = folder.parent / NAME
    if parent.is_file() and any(k.startswith(f"{folder.name}/") for k in load(parent)["files"]):
        return parent
    return None


def load(path: str | Path) -> dict[str, Any]:
    """A manifest as a dict; a malformed one is an :class:`InputError`."""
    try:
        record = json.loads(Path(path).read_text())
        files = record["files"]
        if record.get("format") != FORMAT or not isinstance(files, dict):
            raise ValueError(f"format {record.get('format')!r}")
        for entry in files.values():
            if not isinstance(entry.get("sha256"), str):
                raise ValueError("an entry has no sha256")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(
            str(path),
            "(manifest)",
            f"is not a {FORMAT} manifest ({exc})",
            "write the data again with `slurmtf data`, or delete the manifest",
        ) from exc
    out: dict[str, Any] = record
    return out


def verify(paths: Iterable[str | Path]) -> Path | None:
    """Check ``paths`` against the manifest beside them; returns the manifest, if any.

    Files outside any manifest pass unchecked (data sets the user brought). A file that a
    manifest covers must be listed in it with the same SHA-256.
    """
    found: Path | None = None
    for path in paths:
        manifest_path = find(path)
        if manifest_path is None:
            continue
        found = manifest_path
        files = load(manifest_path)["files"]
        # folders resolved, not the file: a linked data file keeps its name here
        where = Path(path).parent.resolve() / Path(path).name
        relative = where.relative_to(manifest_path.parent.resolve()).as_posix()
        if relative not in files:
            raise InputError(
                str(path),
                relative,
                f"is not listed in {manifest_path}",
                "use the files the manifest lists (e.g. the .gz ones), or delete the manifest",
            )
        actual, expected = sha256_file(path), files[relative]["sha256"]
        if actual != expected:
            raise InputError(
                str(path),
                f"sha256:{actual[:16]}...",
                f"does not match {manifest_path} (sha256:{expected[:16]}...)",
                "the file is damaged or was replaced; write or fetch the data set again",
            )
    return found


def verify_directory(directory: str | Path) -> dict[str, Any]:
    """Check every file ``directory``'s manifest lists; returns the manifest."""
    path = Path(directory) / NAME
    if not path.is_file():
        raise InputError(
            "DIR",
            str(directory),
            f"has no {NAME}",
            "write it with `slurmtf data sample-mnist` or `slurmtf data fetch`",
        )
    record = load(path)
    for relative in record["files"]:
        file = Path(directory) / relative
        if not file.is_file():
            raise InputError(
                str(file), "(missing)", f"is listed in {path}", "write or fetch the data set again"
            )
    verify(Path(directory) / relative for relative in record["files"])
    return record


def describe(record: dict[str, Any]) -> str:
    """One line about a manifest: what the data is, its source and licence."""
    return (
        f"{record.get('description', record.get('name', '?'))}; source: "
        f"{record.get('source', '?')}; licence: {record.get('licence', '?')}"
    )
