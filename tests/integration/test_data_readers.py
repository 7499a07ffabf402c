"""The input readers on tiny files in each real format, written by the tests.

The files come from :mod:`tests.helpers.datafiles`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from slurmtf.errors import InputError
from tests.helpers.datafiles import (
    idx_bytes,
    learnable_images,
    write_cifar,
    write_imagenet,
    write_mnist,
)

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.tf


def context(pipelines: int = 1, index: int = 0) -> Any:
    import tensorflow as tf

    return tf.distribute.InputContext(pipelines, index, pipelines)


def first(ds: Any) -> tuple[Any, Any]:
    images, labels = next(iter(ds))
    return images.numpy(), labels.numpy()


# ------------------------------------------------------------------ MNIST


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_idx_round_trip(tmp_path: Path, gz: bool) -> None:
    from models.data import mnist

    write_mnist(tmp_path, n_train=20, n_eval=10, gz=gz)
    images, labels = mnist.load(str(tmp_path), training=True)
    expected, expected_labels = learnable_images(20, (28, 28), 10, 1)
    assert images.shape == (20, 28, 28)
    np.testing.assert_array_equal(images, expected)
    np.testing.assert_array_equal(labels, expected_labels)
    assert mnist.num_examples(str(tmp_path), training=False) == 10


def test_mnist_dataset_batches_and_scales(tmp_path: Path) -> None:
    from models.data import mnist

    write_mnist(tmp_path, n_train=20, n_eval=10)
    x, y = first(mnist.dataset(context(), 5, data_dir=str(tmp_path), training=False, seed=0))
    assert x.shape == (5, 28, 28, 1)
    assert x.dtype == np.float32
    assert x.min() >= 0.0
    assert x.max() <= 1.0
    np.testing.assert_array_equal(y, [0, 1, 2, 3, 4])


def test_mnist_shards_cover_the_global_batch(tmp_path: Path) -> None:
    """Two workers' per-replica batches of one step = one worker's global batch."""
    from models.data import mnist

    write_mnist(tmp_path, n_train=40, n_eval=10)
    one = first(mnist.dataset(context(), 8, data_dir=str(tmp_path), training=True, seed=5))
    parts = [
        first(mnist.dataset(context(2, i), 4, data_dir=str(tmp_path), training=True, seed=5))
        for i in range(2)
    ]
    key = lambda x: sorted(map(bytes, x.reshape(len(x), -1)))  # noqa: E731
    assert key(one[0]) == key(np.concatenate([p[0] for p in parts]))
    assert not set(key(parts[0][0])) & set(key(parts[1][0]))


def test_mnist_bad_files(tmp_path: Path) -> None:
    from models.data import mnist

    (tmp_path / "x").write_bytes(b"\x00\x00\x99\x01")
    with pytest.raises(InputError, match="not an IDX file"):
        mnist.read_idx(tmp_path / "x")
    (tmp_path / "y").write_bytes(idx_bytes(np.zeros((4, 2), np.uint8))[:-3])
    with pytest.raises(InputError, match="truncated"):
        mnist.read_idx(tmp_path / "y")
    with pytest.raises(InputError, match=r"--data_dir=.*HINT: "):
        mnist.load(str(tmp_path), training=True)


# ------------------------------------------------------------------ CIFAR-10


def test_cifar_decodes_records(tmp_path: Path) -> None:
    from models.data import cifar

    write_cifar(tmp_path, per_file=6)
    assert cifar.num_examples(str(tmp_path), training=True) == 30
    assert cifar.num_examples(str(tmp_path / "cifar-10-batches-bin"), training=False) == 6
    x, y = first(cifar.dataset(context(), 6, data_dir=str(tmp_path), training=False, seed=0))
    images, labels = learnable_images(6, (32, 32, 3), 10, seed=15)  # test_batch.bin
    np.testing.assert_array_equal(y, labels)
    mean, std = np.array(cifar.MEAN), np.array(cifar.STD)
    np.testing.assert_allclose(x, (images / 255.0 - mean) / std, atol=1e-5)


def _values(files: list[str], workers: int, index: int, steps: int) -> set[int]:
    import tensorflow as tf

    from models.data.common import file_pipeline

    ds = file_pipeline(
        files,
        context(workers, index),
        2,
        training=False,
        seed=0,
        read_file=lambda path: tf.data.FixedLengthRecordDataset(path, 1),
        decode=lambda rec: (tf.io.decode_raw(rec, tf.uint8)[0], tf.constant(0)),
    )
    return {int(v) for batch, _ in ds.take(steps) for v in batch.numpy()}


@pytest.mark.parametrize("workers", [2, 3])
def test_shards_by_files_when_there_are_enough(tmp_path: Path, workers: int) -> None:
    files = []
    for f in range(3):
        (tmp_path / f"part{f}").write_bytes(bytes(10 * f + j for j in range(4)))
        files.append(str(tmp_path / f"part{f}"))
    for index in range(workers):
        owned = {10 * f + j for f in range(index, 3, workers) for j in range(4)}
        assert _values(files, workers, index, 6) == owned


def test_shards_by_records_when_files_are_fewer_than_workers(tmp_path: Path) -> None:
    (tmp_path / "only").write_bytes(bytes(range(8)))
    files = [str(tmp_path / "only")]
    assert _values(files, 2, 0, 4) == {0, 2, 4, 6}
    assert _values(files, 2, 1, 4) == {1, 3, 5, 7}


def test_cifar_training_augments_and_eval_is_exact(tmp_path: Path) -> None:
    from models.data import cifar

    write_cifar(tmp_path, per_file=4)
    x, y = first(cifar.dataset(context(), 4, data_dir=str(tmp_path), training=True, seed=1))
    assert x.shape == (4, 32, 32, 3)
    assert y.dtype == np.int32


def test_cifar_rejects_pickles(tmp_path: Path) -> None:
    from models.data import cifar

    (tmp_path / "test_batch.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(InputError, match="binary"):
        cifar.files(str(tmp_path), training=False)


# ------------------------------------------------------------------ ImageNet


def test_imagenet_tfrecords(tmp_path: Path) -> None:
    from models.data import imagenet

    write_imagenet(tmp_path, train_files=2, per_file=3)
    assert len(imagenet.files(str(tmp_path), training=True)) == 2
    assert imagenet.count_records(imagenet.files(str(tmp_path), training=False)) == 3
    x, y = first(
        imagenet.dataset(
            context(), 3, data_dir=str(tmp_path), training=False, seed=0, image_size=32
        )
    )
    assert x.shape == (3, 32, 32, 3)
    np.testing.assert_array_equal(y, [1, 2, 3])  # official labels are 1-based
    assert abs(float(x.mean())) < 3.0
    x, _ = first(
        imagenet.dataset(
            context(2, 1), 2, data_dir=str(tmp_path), training=True, seed=0, image_size=24
        )
    )
    assert x.shape == (2, 24, 24, 3)


def test_imagenet_missing_files(tmp_path: Path) -> None:
    from models.data import imagenet

    with pytest.raises(InputError, match="train-"):
        imagenet.files(str(tmp_path), training=True)


# ------------------------------------------------------------------ synthetic


def test_synthetic_is_deterministic_and_sharded() -> None:
    from models.data import synthetic

    kw: dict[str, Any] = {"shape": (8, 8, 1), "num_classes": 4, "num_examples": 32, "seed": 3}
    one = first(synthetic.dataset(context(), 8, training=True, **kw))
    again = first(synthetic.dataset(context(), 8, training=True, **kw))
    np.testing.assert_array_equal(one[0], again[0])
    parts = [first(synthetic.dataset(context(2, i), 4, training=True, **kw)) for i in range(2)]
    key = lambda x: sorted(map(bytes, x.reshape(len(x), -1)))  # noqa: E731
    assert key(one[0]) == key(np.concatenate([p[0] for p in parts]))
    np.testing.assert_array_equal(np.sort(one[1]), np.sort(np.concatenate([p[1] for p in parts])))


def test_skip_batches_continues_the_stream() -> None:
    """A resumed pipeline (skip_batches=k) starts where batch k of a fresh one would be."""
    from models.data import synthetic

    kw: dict[str, Any] = {"shape": (4, 4, 1), "num_classes": 3, "num_examples": 10, "seed": 1}
    fresh = [b[1].numpy() for b in synthetic.dataset(context(), 4, training=True, **kw).take(6)]
    resumed = synthetic.dataset(context(), 4, training=True, skip_batches=4, **kw)
    later = [b[1].numpy() for b in resumed.take(2)]
    np.testing.assert_array_equal(np.stack(fresh[4:]), np.stack(later))


def test_imagenet_records_are_counted_without_tensorflow(tmp_path: Path) -> None:
    """The count comes before the multi-worker strategy: it must not start TensorFlow."""
    write_imagenet(tmp_path, train_files=2, per_file=3)
    program = (
        "import sys\n"
        "from models.data import imagenet\n"
        f"paths = imagenet.files({str(tmp_path)!r}, training=True)\n"
        "print(imagenet.count_records(paths), 'tensorflow' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["6", "False"], done.stdout + done.stderr


def test_a_truncated_tfrecord_file_is_an_input_error(tmp_path: Path) -> None:
    from models.data import imagenet

    write_imagenet(tmp_path, train_files=1, per_file=3)
    (shard,) = imagenet.files(str(tmp_path), training=True)
    data = Path(shard).read_bytes()
    Path(shard).write_bytes(data[:-5])
    with pytest.raises(InputError, match="truncated TFRecord"):
        imagenet.count_records([shard])
