"""Tiny data sets in each real format (MNIST IDX, CIFAR-10 binary, ImageNet TFRecords)."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np


def learnable_images(n: int, shape: tuple[int, ...], classes: int, seed: int) -> tuple[Any, Any]:
    """uint8 images whose class is a bright band position, plus noise: learnable."""
    rng = np.random.default_rng(seed)
    labels = (np.arange(n) % classes).astype(np.uint8)
    images = rng.integers(0, 60, size=(n, *shape), dtype=np.uint8)
    band = shape[0] // classes
    for i, label in enumerate(labels):
        images[i, label * band : (label + 1) * band] = 230
    return images, labels


def idx_bytes(array: Any) -> bytes:
    """``array`` as an uint8 IDX file (the MNIST format)."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape
    )
    return header + array.astype(np.uint8).tobytes()


def write_mnist(root: Path, n_train: int = 64, n_eval: int = 32, gz: bool = True) -> Path:
    """The four MNIST IDX files (gzipped or not) with learnable images."""
    root.mkdir(parents=True, exist_ok=True)
    for prefix, n, seed in (("train", n_train, 1), ("t10k", n_eval, 2)):
        images, labels = learnable_images(n, (28, 28), 10, seed)
        for kind, data in (("images-idx3", images), ("labels-idx1", labels)):
            raw = idx_bytes(data)
            name = f"{prefix}-{kind}-ubyte"
            if gz:
                (root / f"{name}.gz").write_bytes(gzip.compress(raw))
            else:
                (root / name).write_bytes(raw)
    return root


def write_cifar(root: Path, per_file: int = 8) -> Path:
    """``cifar-10-batches-bin/`` with 5 train files and a test file of ``per_file`` records."""
    out = root / "cifar-10-batches-bin"
    out.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    for k, name in enumerate(names):
        images, labels = learnable_images(per_file, (32, 32, 3), 10, seed=10 + k)
        planes = images.transpose(0, 3, 1, 2).reshape(per_file, -1)  # HWC -> CHW planes
        records = np.concatenate([labels[:, None], planes], axis=1).astype(np.uint8)
        (out / name).write_bytes(records.tobytes())
    return root


def write_imagenet(root: Path, train_files: int = 2, per_file: int = 4, side: int = 48) -> Path:
    """Official-format TFRecords: ``image/encoded`` JPEG and ``image/class/label`` 1..1000."""
    import tensorflow as tf

    root.mkdir(parents=True, exist_ok=True)
    splits = [(f"train-{i:05d}-of-{train_files:05d}", 20 + i) for i in range(train_files)]
    splits.append(("validation-00000-of-00001", 99))
    for name, seed in splits:
        images, labels = learnable_images(per_file, (side, side + 8, 3), 4, seed)
        with tf.io.TFRecordWriter(str(root / name)) as writer:
            for image, label in zip(images, labels, strict=True):
                feature = {
                    "image/encoded": tf.train.Feature(
                        bytes_list=tf.train.BytesList(value=[tf.io.encode_jpeg(image).numpy()])
                    ),
                    "image/class/label": tf.train.Feature(
                        int64_list=tf.train.Int64List(value=[int(label) + 1])
                    ),
                    "image/format": tf.train.Feature(
                        bytes_list=tf.train.BytesList(value=[b"JPEG"])
                    ),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
    return root


def have_sklearn() -> bool:
    """Whether scikit-learn (the ``data`` extra, the real-digit sample) is installed."""
    try:
        import sklearn  # noqa: F401
    except ImportError:
        return False
    return True


def with_manifest(root: Path, name: str = "test-data") -> Path:
    """``root`` with a MANIFEST.json listing every file under it (as ``slurmtf data`` writes)."""
    from slurmtf.datasets import manifest

    files = {
        p.relative_to(root).as_posix(): manifest.sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != manifest.NAME
    }
    manifest.write(
        root, manifest.Manifest(name, "files written by the tests", "tests", "n/a", files)
    )
    return root
