"""CIFAR-10 in the original binary format (``data_batch_1.bin`` .. ``_5.bin``, ``test_batch.bin``).

Each record is 1 label byte followed by 3072 image bytes (3 planes of 32x32, R, G, B).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slurmtf.datasets import manifest
from slurmtf.errors import InputError

from .common import file_pipeline

HEIGHT = WIDTH = 32
CHANNELS = 3
RECORD_BYTES = 1 + HEIGHT * WIDTH * CHANNELS
NUM_CLASSES = 10
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def files(data_dir: str, training: bool) -> list[str]:
    """The split's files; ``data_dir`` is ``cifar-10-batches-bin`` or its parent.

    Files covered by a ``MANIFEST.json`` must match their SHA-256 in it.
    """
    root = Path(data_dir)
    if (root / "cifar-10-batches-bin").is_dir():
        root = root / "cifar-10-batches-bin"
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] if training else ["test_batch.bin"]
    found = [str(root / n) for n in names if (root / n).exists()]
    if not found:
        raise InputError(
            "--data_dir", data_dir, f"has no {names[0]}", "extract cifar-10-binary.tar.gz there"
        )
    for path in found:
        size = Path(path).stat().st_size
        if size == 0 or size % RECORD_BYTES:
            raise InputError(
                path,
                size,
                f"is not a whole number of {RECORD_BYTES}-byte records",
                "use the CIFAR-10 *binary* version, not the python pickles",
            )
    manifest.verify(found)  # against MANIFEST.json, where `slurmtf data fetch` wrote one
    return found


def num_examples(data_dir: str, training: bool) -> int:
    """Records in a split, from the file sizes."""
    return sum(Path(p).stat().st_size // RECORD_BYTES for p in files(data_dir, training))


def dataset(
    ctx: Any, batch: int, *, data_dir: str, training: bool, seed: int, skip_batches: int = 0
) -> Any:
    """This worker's CIFAR-10 dataset: normalized float32 [b, 32, 32, 3], int32 labels.

    Training adds the standard augmentation: pad to 40, random 32x32 crop, random flip.
    """
    import tensorflow as tf

    mean = tf.constant(MEAN, tf.float32)
    std = tf.constant(STD, tf.float32)

    def read_file(path: Any) -> Any:
        return tf.data.FixedLengthRecordDataset(path, RECORD_BYTES)

    def decode(record: Any) -> tuple[Any, Any]:
        raw = tf.io.decode_raw(record, tf.uint8)
        label = tf.cast(raw[0], tf.int32)
        # float32 before the transpose: oneDNN logs an error-level line for a uint8
        # transpose on CPUs it was not built for (the values are the same either way).
        image = tf.cast(tf.reshape(raw[1:], (CHANNELS, HEIGHT, WIDTH)), tf.float32) / 255.0
        image = tf.transpose(image, (1, 2, 0))
        if training:
            image = tf.image.resize_with_crop_or_pad(image, HEIGHT + 8, WIDTH + 8)
            image = tf.image.random_crop(image, (HEIGHT, WIDTH, CHANNELS), seed=seed)
            image = tf.image.random_flip_left_right(image, seed=seed)
        return (image - mean) / std, label

    return file_pipeline(
        files(data_dir, training),
        ctx,
        batch,
        training=training,
        seed=seed,
        read_file=read_file,
        skip_batches=skip_batches,
        decode=decode,
    )
