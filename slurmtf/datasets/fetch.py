"""Download full MNIST or CIFAR-10 into a ``--data_dir``, checked against published SHA-256.

For a login node with internet access (compute nodes rarely have it): ::

    slurmtf data fetch mnist /shared/data/mnist
    slurmtf data fetch cifar10 /shared/data/cifar10 --mirror https://my.mirror/cifar/

Every file is streamed to a temporary file, hashed on the way, and renamed into place
only when its size and SHA-256 are the published ones; a file already there with the
right checksum is not downloaded again. CIFAR-10's archive is then unpacked (regular files
under ``cifar-10-batches-bin/`` only). ``MANIFEST.json`` records every file's SHA-256, so
the readers in ``models/data`` check the data each time a job reads it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from slurmtf.datasets import manifest
from slurmtf.errors import InputError, SlurmtfError

Log = Callable[[str], None]


class FetchError(SlurmtfError, RuntimeError):
    """No mirror served a file; the message names every URL tried and why it failed."""


@dataclasses.dataclass(frozen=True)
class Remote:
    """One published file: its name on the mirror, size in bytes and SHA-256."""

    name: str
    size: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class DataSet:
    """A downloadable data set: where it is published and what its files must hash to."""

    name: str
    description: str
    mirrors: tuple[str, ...]
    files: tuple[Remote, ...]
    source: str
    licence: str
    unpack: str = ""  # folder of an archive's members to extract ("" = no archive)


MNIST = DataSet(
    name="mnist",
    description="MNIST, 60,000 train / 10,000 test handwritten digits, 28x28",
    mirrors=(
        "https://storage.googleapis.com/cvdf-datasets/mnist/",  # the mirror TensorFlow uses
        "https://ossci-datasets.s3.amazonaws.com/mnist/",  # the mirror torchvision uses
    ),
    files=(
        Remote(
            "train-images-idx3-ubyte.gz",
            9_912_422,
            "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
        ),
        Remote(
            "train-labels-idx1-ubyte.gz",
            28_881,
            "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
        ),
        Remote(
            "t10k-images-idx3-ubyte.gz",
            1_648_877,
            "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
        ),
        Remote(
            "t10k-labels-idx1-ubyte.gz",
            4_542,
            "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
        ),
    ),
    source="Y. LeCun, C. Cortes, C. J. C. Burges, http://yann.lecun.com/exdb/mnist/",
    licence="CC BY-SA 3.0 (as stated by the authors)",
)

CIFAR10 = DataSet(
    name="cifar10",
    description="CIFAR-10 binary version, 50,000 train / 10,000 test images, 32x32x3",
    mirrors=("https://www.cs.toronto.edu/~kriz/",),
    files=(
        Remote(
            "cifar-10-binary.tar.gz",  # published MD5 c32a1d4ab5d03f1284b67883e8d87530
            170_052_171,
            "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd",
        ),
    ),
    source="A. Krizhevsky, 2009, https://www.cs.toronto.edu/~kriz/cifar.html",
    licence="no licence stated by the authors; cite Krizhevsky (2009)",
    unpack="cifar-10-batches-bin",
)

DATA_SETS = {d.name: d for d in (MNIST, CIFAR10)}


def data_set(name: str) -> DataSet:
    """The data set called ``name`` (``mnist``, ``cifar10``)."""
    if name not in DATA_SETS:
        raise InputError("DATASET", name, "is not one slurmtf fetches", " or ".join(DATA_SETS))
    return DATA_SETS[name]


def fetch(
    name: str,
    directory: str | Path,
    *,
    mirror: str | None = None,
    files: tuple[Remote, ...] | None = None,
    timeout: float = 60.0,
    log: Log = print,
) -> manifest.Manifest:
    """Download data set ``name`` into ``directory``, verify, unpack, write the manifest.

    ``mirror`` (a base URL) replaces the published mirrors; ``files`` replaces the
    published sizes and checksums (for a mirror of other files, e.g. in tests).
    """
    spec = data_set(name)
    if files is not None:
        spec = dataclasses.replace(spec, files=files)
    if mirror is not None and not mirror.startswith(("http://", "https://", "file://")):
        raise InputError(
            "--mirror", mirror, "is not a URL", "e.g. --mirror=https://host/path/ (the folder)"
        )
    mirrors = (mirror,) if mirror else spec.mirrors
    directory = Path(directory)
    digests = {}
    for remote in spec.files:
        download(remote, directory / remote.name, mirrors, timeout=timeout, log=log)
        digests[remote.name] = remote.sha256
    if spec.unpack:
        for remote in spec.files:
            digests |= unpack(directory / remote.name, directory, spec.unpack, log=log)
    record = manifest.Manifest(
        name=spec.name,
        description=spec.description,
        source=spec.source,
        licence=spec.licence,
        files=digests,
        extra={"made_by": "slurmtf data fetch", "mirrors": list(mirrors)},
    )
    manifest.write(directory, record)
    log(f"{spec.name}: {len(digests)} files verified in {directory}")
    return record


def download(
    remote: Remote, dest: Path, mirrors: tuple[str, ...], *, timeout: float, log: Log
) -> None:
    """Put ``remote`` at ``dest`` from the first mirror that serves the right bytes."""
    if dest.is_file() and manifest.sha256_file(dest) == remote.sha256:
        log(f"{dest.name}: already here, checksum matches")
        return
    failures: list[str] = []
    mismatch: InputError | None = None
    for base in mirrors:
        url = base.rstrip("/") + "/" + remote.name
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                _save_checked(response, dest, remote, url)
        except InputError as exc:  # the wrong bytes: try the next mirror, then say so
            failures.append(f"{url}: wrong size or checksum")
            mismatch = exc
            continue
        except urllib.error.HTTPError as exc:
            failures.append(f"{url}: HTTP {exc.code} {exc.reason}")
            continue
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            failures.append(f"{url}: {getattr(exc, 'reason', None) or exc}")
            continue
        log(f"{dest.name}: {remote.size:,} bytes from {url}, sha256 {remote.sha256[:16]}... ok")
        return
    if mismatch is not None:
        raise mismatch
    raise FetchError(
        f"could not fetch {remote.name} ({'; '.join(failures)}). HINT: check the login "
        "node's internet access, or pass --mirror=URL of a copy of the files"
    )


def _save_checked(response: Any, dest: Path, remote: Remote, url: str) -> None:
    """Stream ``response`` into ``dest`` atomically; wrong size or SHA-256 keeps nothing."""
    digest, size = hashlib.sha256(), 0
    with manifest.atomic_open(dest) as handle:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
            if size > remote.size:
                break  # more than published: wrong file, stop reading
            handle.write(chunk)
        if size != remote.size or digest.hexdigest() != remote.sha256:
            served = f"over {remote.size:,}" if size > remote.size else f"{size:,}"
            raise InputError(
                "--mirror",
                url,
                f"served {served} bytes with sha256 {digest.hexdigest()[:16]}..., "
                f"expected {remote.size:,} bytes with sha256 {remote.sha256[:16]}...",
                "the mirror holds another file; use the official mirrors or a faithful copy",
            )


def unpack(archive: Path, directory: Path, folder: str, *, log: Log) -> dict[str, str]:
    """Extract the regular files under ``folder/`` of a tar archive; path -> SHA-256.

    Members elsewhere, links, devices and paths with ``..`` or a leading ``/`` are skipped.
    """
    digests = {}
    with tarfile.open(archive) as tar:
        for member in tar:
            path = PurePosixPath(member.name)
            if (
                not member.isfile()
                or path.is_absolute()
                or ".." in path.parts
                or path.parts[:1] != (folder,)
            ):
                continue
            source = tar.extractfile(member)
            if source is None:
                continue
            with source, manifest.atomic_open(directory / path) as handle:
                digest = hashlib.sha256()
                while chunk := source.read(1 << 20):
                    digest.update(chunk)
                    handle.write(chunk)
            digests[path.as_posix()] = digest.hexdigest()
    if not digests:
        raise InputError(
            str(archive), folder, "has no files under this folder", "fetch the archive again"
        )
    log(f"{archive.name}: unpacked {len(digests)} files into {directory / folder}")
    return digests
