"""A small REAL MNIST-format sample: the UCI handwritten digits scikit-learn ships.

``sklearn.datasets.load_digits`` holds 1,797 handwritten digits (8x8, 17 grey levels)
from 13 writers: the test set of the UCI "Optical Recognition of Handwritten Digits"
collection (Alpaydin and Kaynak, 1998). :func:`write_mnist_sample` turns them into
MNIST's own four IDX files: each digit scaled to 20x20 (bilinear) and centred in 28x28,
as MNIST centres its digits in a 20x20 box, grey levels 0..16 stretched to 0..255. The
split is fixed and needs no random numbers: the first 1,437 digits (80 %) train, the last
360 are held out, as scikit-learn's own digits example splits without shuffling. The
scaling is integer arithmetic, so the IDX content is the same on every machine (and the
gzip bytes too with the same zlib: no timestamp); ``MANIFEST.json`` records the files'
SHA-256, the source and the licence.

scikit-learn is an optional extra (``pip install "slurmtf[data]"``); nothing here imports
it until :func:`load_digits` runs.
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from slurmtf.datasets import manifest
from slurmtf.errors import InputError

SIDE, BOX = 28, 20  # MNIST: digits in a 20x20 box centred in 28x28
NUM_TRAIN = 1437  # of 1,797: the first 80 % train, the last 360 are held out
NAME = "mnist-sample-uci-digits"
SOURCE = (
    "UCI ML Repository, Optical Recognition of Handwritten Digits (E. Alpaydin, C. Kaynak, "
    "1998; https://archive.ics.uci.edu/dataset/80, doi:10.24432/C50P49), the 1,797-digit "
    "copy shipped by scikit-learn as sklearn.datasets.load_digits"
)
LICENCE = "CC BY 4.0 (UCI ML Repository); cite Alpaydin and Kaynak (1998)"


def load_digits() -> tuple[np.ndarray, np.ndarray, str]:
    """``(images uint8 [1797, 8, 8] in 0..16, labels uint8 [1797], sklearn version)``."""
    try:
        import sklearn
        from sklearn.datasets import load_digits as sk_load_digits
    except ImportError as exc:
        raise InputError(
            "scikit-learn",
            "(not installed)",
            "is needed to write the handwritten-digit sample",
            'pip install "slurmtf[data]" (or: pip install scikit-learn)',
        ) from exc
    digits = sk_load_digits()
    images = np.asarray(digits.images).astype(np.uint8)
    labels = np.asarray(digits.target).astype(np.uint8)
    return images, labels, str(sklearn.__version__)


def _resize_matrix(src: int, dst: int) -> np.ndarray:
    """``[dst, src]`` bilinear weights (pixel centres aligned) as integers over ``2 * dst``.

    Integers keep the result exact, so the files are the same bytes with any BLAS.
    """
    den = 2 * dst
    weights = np.zeros((dst, src), np.int64)
    for o in range(dst):
        centre = (2 * o + 1) * src - dst  # the source position, times den
        centre = min(max(centre, 0), (src - 1) * den)
        low, frac = divmod(centre, den)
        weights[o, low] += den - frac
        if frac:
            weights[o, low + 1] += frac
    return weights


def to_mnist_images(images: np.ndarray, levels: int = 16) -> np.ndarray:
    """``[n, h, w]`` grey levels 0..``levels`` -> uint8 ``[n, 28, 28]`` like MNIST's."""
    n, height, width = images.shape
    rows, cols = _resize_matrix(height, BOX), _resize_matrix(width, BOX)
    scaled = rows @ images.astype(np.int64) @ cols.T  # [20, h] @ [n, h, w] @ [w, 20]
    den = (2 * BOX) ** 2 * levels
    grey = (2 * scaled * 255 + den) // (2 * den)  # round half up, exactly
    out = np.zeros((n, SIDE, SIDE), np.uint8)
    pad = (SIDE - BOX) // 2
    out[:, pad : pad + BOX, pad : pad + BOX] = np.clip(grey, 0, 255)
    return out


def idx_bytes(array: np.ndarray) -> bytes:
    """One uint8 IDX file (magic 0x0000 08 ndim, big-endian dims, data)."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape
    )
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def write_idx_files(
    directory: Path, splits: dict[str, tuple[np.ndarray, np.ndarray]]
) -> dict[str, str]:
    """``train``/``t10k`` -> (images, labels) as four ``*-ubyte.gz``; name -> SHA-256."""
    written = {}
    for prefix, (images, labels) in splits.items():
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            name = f"{prefix}-{kind}-ubyte.gz"
            data = gzip.compress(idx_bytes(array), compresslevel=9, mtime=0)
            manifest.atomic_write(directory / name, data)
            written[name] = hashlib.sha256(data).hexdigest()
    return written


def write_mnist_sample(directory: str | Path, digits: Any = None) -> manifest.Manifest:
    """Write the sample's four IDX files and its ``MANIFEST.json`` into ``directory``.

    ``digits`` is ``(images, labels, version)`` as :func:`load_digits` returns (tests pass
    their own); by default scikit-learn's copy is loaded.
    """
    images, labels, version = digits if digits is not None else load_digits()
    if images.ndim != 3 or len(images) != len(labels) or len(images) <= NUM_TRAIN:
        raise InputError(
            "digits", images.shape, f"need more than {NUM_TRAIN} images [n, h, w]", "see load"
        )
    directory = Path(directory)
    big = to_mnist_images(images)
    files = write_idx_files(
        directory,
        {
            "train": (big[:NUM_TRAIN], labels[:NUM_TRAIN]),
            "t10k": (big[NUM_TRAIN:], labels[NUM_TRAIN:]),
        },
    )
    source_digest = hashlib.sha256(images.tobytes() + labels.tobytes()).hexdigest()
    record = manifest.Manifest(
        name=NAME,
        description=(
            f"{len(images):,} real handwritten digits (13 writers), 8x8 scaled to 28x28, "
            f"{NUM_TRAIN:,} train / {len(images) - NUM_TRAIN:,} held out"
        ),
        source=SOURCE,
        licence=LICENCE,
        files=files,
        extra={
            "made_by": f"slurmtf data sample-mnist (scikit-learn {version})",
            "split": f"train = digits[:{NUM_TRAIN}], t10k = digits[{NUM_TRAIN}:] (fixed order)",
            "source_sha256": source_digest,
            "examples": {"train": NUM_TRAIN, "t10k": len(images) - NUM_TRAIN},
        },
    )
    manifest.write(directory, record)
    return record
