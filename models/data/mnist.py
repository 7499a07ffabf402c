"""MNIST in the original IDX format (``train-images-idx3-ubyte[.gz]`` etc., gzip or not)."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np

from slurmtf.datasets import manifest
from slurmtf.errors import InputError

from .common import index_pipeline

FILES = {
    True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_DTYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (optionally gzipped) into an array of its declared shape."""
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _DTYPES:
        raise InputError(
            str(path),
            raw[:4].hex(),
            "not an IDX file (bad magic number)",
            "pass the original MNIST files from yann.lecun.com, gzipped or not",
        )
    ndim = raw[3]
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_DTYPES[raw[2]])
    header = 4 + 4 * ndim
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - header != expected:
        raise InputError(
            str(path),
            len(raw),
            f"holds {len(raw) - header} data bytes, its header says {expected}",
            "the file is truncated; download it again",
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)


def find(data_dir: str, training: bool) -> tuple[Path, Path]:
    """Paths of the image and label files, accepting ``name`` or ``name.gz``.

    Where ``data_dir`` has a ``MANIFEST.json`` (``slurmtf data``), both files must match
    their SHA-256 in it.
    """
    found = []
    for stem in FILES[training]:
        candidates = [
            Path(data_dir) / stem,
            Path(data_dir) / f"{stem}.gz",
            Path(data_dir) / stem.replace("-idx", ".idx"),
        ]
        match = next((c for c in candidates if c.exists()), None)
        if match is None:
            raise InputError(
                "--data_dir",
                data_dir,
                f"has no {stem}[.gz]",
                "point it at the directory holding the four MNIST IDX files",
            )
        found.append(match)
    manifest.verify(found)
    return found[0], found[1]


def load(data_dir: str, training: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(images uint8 [n, 28, 28], labels uint8 [n])`` of one split."""
    image_path, label_path = find(data_dir, training)
    images, labels = read_idx(image_path), read_idx(label_path)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise InputError(
            "--data_dir",
            data_dir,
            f"images {images.shape} and labels {labels.shape} do not match",
            "use the matching images/labels files of one split",
        )
    return images, labels


def dataset(
    ctx: Any, batch: int, *, data_dir: str, training: bool, seed: int, skip_batches: int = 0
) -> Any:
    """This worker's MNIST dataset: float32 images [b, 28, 28, 1] in [0, 1], int32 labels."""
    import tensorflow as tf

    images, labels = load(data_dir, training)
    images_t = tf.constant(images)
    labels_t = tf.constant(labels.astype(np.int32))

    def make_batch(indices: Any) -> tuple[Any, Any]:
        x = tf.cast(tf.gather(images_t, indices), tf.float32) / 255.0
        return x[..., None], tf.gather(labels_t, indices)

    return index_pipeline(
        len(images),
        ctx,
        batch,
        training=training,
        seed=seed,
        make_batch=make_batch,
        skip_batches=skip_batches,
    )


def num_examples(data_dir: str, training: bool) -> int:
    """Number of examples in a split, from the label file's header."""
    return int(read_idx(find(data_dir, training)[1]).shape[0])
