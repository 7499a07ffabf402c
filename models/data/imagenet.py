"""ImageNet as TFRecords in the official format (``train-00000-of-01024``, ``validation-*``).

Each ``tf.train.Example`` holds ``image/encoded`` (JPEG bytes) and ``image/class/label``
(1..1000; 0 is the unused background class of the official 1001-way models).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slurmtf.errors import InputError

from .common import file_pipeline

NUM_CLASSES = 1001
MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STDDEV_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)
CROP_PADDING = 32


def files(data_dir: str, training: bool) -> list[str]:
    """Sorted shard files of a split (``train-*`` or ``validation-*``)."""
    prefix = "train-" if training else "validation-"
    found = sorted(str(p) for p in Path(data_dir).glob(f"{prefix}*") if p.is_file())
    if not found:
        raise InputError(
            "--data_dir",
            data_dir,
            f"has no {prefix}*-of-* TFRecord files",
            "build them with the official ImageNet-to-TFRecord script",
        )
    return found


def count_records(paths: list[str]) -> int:
    """Records in the TFRecord files ``paths``, from their framing alone.

    Plain file reads, no TensorFlow: the count is taken before the multi-worker strategy
    exists, and any TensorFlow op run then would start TensorFlow's runtime too early for
    it ("Collective ops must be configured at program startup"). Each record is a
    little-endian uint64 length, a 4-byte CRC, the data and a 4-byte CRC.
    """
    total = 0
    for name in paths:
        with Path(name).open("rb") as stream:
            size = stream.seek(0, 2)
            position = 0
            while position < size:
                stream.seek(position)
                header = stream.read(8)
                if len(header) < 8:
                    break
                position += 8 + 4 + int.from_bytes(header, "little") + 4
                if position > size:
                    raise InputError(
                        "--data_dir",
                        name,
                        "ends inside a record (a truncated TFRecord file)",
                        "copy the file again, or remove it from the folder",
                    )
                total += 1
    return total


def parse(serialized: Any) -> tuple[Any, Any]:
    """``tf.train.Example`` -> (JPEG bytes, int32 label)."""
    import tensorflow as tf

    features = tf.io.parse_single_example(
        serialized,
        {
            "image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
        },
    )
    return features["image/encoded"], tf.cast(features["image/class/label"], tf.int32)


def preprocess(jpeg: Any, training: bool, size: int, seed: int) -> Any:
    """Inception-style random crop + flip (train) or central crop (eval), resized, normalized."""
    import tensorflow as tf

    shape = tf.image.extract_jpeg_shape(jpeg)
    if training:
        begin, crop_size, _ = tf.image.sample_distorted_bounding_box(
            shape,
            tf.zeros((1, 0, 4)),
            min_object_covered=0.1,
            aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=(0.08, 1.0),
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
            seed=seed,
        )
        y, x, _ = tf.unstack(begin)
        h, w, _ = tf.unstack(crop_size)
    else:
        height, width = shape[0], shape[1]
        side = tf.cast(
            size / (size + CROP_PADDING) * tf.cast(tf.minimum(height, width), tf.float32), tf.int32
        )
        y, x, h, w = (height - side + 1) // 2, (width - side + 1) // 2, side, side
    image = tf.image.decode_and_crop_jpeg(jpeg, tf.stack([y, x, h, w]), channels=3)
    image = tf.image.resize(image, (size, size), method="bilinear")
    if training:
        image = tf.image.random_flip_left_right(image, seed=seed)
    return (image - tf.constant(MEAN_RGB)) / tf.constant(STDDEV_RGB)


def dataset(
    ctx: Any,
    batch: int,
    *,
    data_dir: str,
    training: bool,
    seed: int,
    image_size: int = 224,
    skip_batches: int = 0,
) -> Any:
    """This worker's ImageNet dataset: float32 [b, size, size, 3], int32 labels (1..1000)."""
    import tensorflow as tf

    def read_file(path: Any) -> Any:
        return tf.data.TFRecordDataset(path, buffer_size=8 * 1024 * 1024)

    def decode(serialized: Any) -> tuple[Any, Any]:
        jpeg, label = parse(serialized)
        return preprocess(jpeg, training, image_size, seed), label

    return file_pipeline(
        files(data_dir, training),
        ctx,
        batch,
        training=training,
        seed=seed,
        read_file=read_file,
        skip_batches=skip_batches,
        decode=decode,
        shuffle_buffer=10_000 if training else 1,
    )
