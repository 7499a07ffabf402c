"""ResNets of TensorFlow's official models: CIFAR-10 ResNet-20/32/44/56/110 and ImageNet
ResNet-50 v1.5, trained data-parallel across the job.

    python -m models.resnet --resnet_size=56 --data_dir=/data/cifar10 --model_dir=/shared/r56
    python -m models.resnet --resnet_size=50 --data_dir=/data/imagenet --dtype=bf16 --enable_xla

Keras layers, channels_last, float32 logits under mixed precision. See docs/MODELS.md.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Any

from absl import flags

from slurmtf.errors import InputError
from slurmtf.train import ModelSpec, TrainConfig
from slurmtf.train import main as train_main

CIFAR_SIZES = (20, 32, 44, 56, 110)
IMAGENET_SIZES = (50,)
flags.DEFINE_integer("resnet_size", 56, "20|32|44|56|110 (CIFAR-10) or 50 (ImageNet, v1.5).")
flags.DEFINE_integer("image_size", 224, "ImageNet input side in pixels (ResNet-50 only).")
flags.DEFINE_boolean(
    "sync_batch_norm",
    False,
    "Normalise with statistics of the GLOBAL batch (one all-reduce per batch-norm layer and "
    "step), so N workers match one worker on the same global batch. Default: each "
    "replica's own batch, as TensorFlow's official models do (faster; the moving statistics "
    "are averaged over replicas at every evaluation and checkpoint).",
)

CIFAR_WEIGHT_DECAY = 2e-4
IMAGENET_WEIGHT_DECAY = 1e-4
BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5
IMAGENET_TRAIN, IMAGENET_EVAL = 1_281_167, 50_000
SYNTHETIC_TRAIN, SYNTHETIC_EVAL = 10_000, 1_000


def _bn(x: Any, sync: bool) -> Any:
    import keras

    return keras.layers.BatchNormalization(
        momentum=BN_MOMENTUM, epsilon=BN_EPSILON, synchronized=sync
    )(x)


def _conv(filters: int, kernel: int, strides: int, decay: float) -> Any:
    import keras

    return keras.layers.Conv2D(
        filters,
        kernel,
        strides=strides,
        padding="same",
        use_bias=False,
        kernel_initializer="he_normal",
        kernel_regularizer=keras.regularizers.L2(decay),
    )


def _basic_block(x: Any, filters: int, strides: int, decay: float, sync: bool) -> Any:
    import keras

    shortcut = x
    if strides != 1 or x.shape[-1] != filters:
        shortcut = _bn(_conv(filters, 1, strides, decay)(x), sync)
    y = keras.layers.ReLU()(_bn(_conv(filters, 3, strides, decay)(x), sync))
    y = _bn(_conv(filters, 3, 1, decay)(y), sync)
    return keras.layers.ReLU()(keras.layers.Add()([y, shortcut]))


def _bottleneck(x: Any, filters: int, strides: int, decay: float, sync: bool) -> Any:
    """v1.5: the stride sits on the 3x3 convolution, not the first 1x1."""
    import keras

    shortcut = x
    if strides != 1 or x.shape[-1] != 4 * filters:
        shortcut = _bn(_conv(4 * filters, 1, strides, decay)(x), sync)
    y = keras.layers.ReLU()(_bn(_conv(filters, 1, 1, decay)(x), sync))
    y = keras.layers.ReLU()(_bn(_conv(filters, 3, strides, decay)(y), sync))
    y = _bn(_conv(4 * filters, 1, 1, decay)(y), sync)
    return keras.layers.ReLU()(keras.layers.Add()([y, shortcut]))


def _head(x: Any, num_classes: int, decay: float) -> Any:
    import keras

    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.layers.Dense(
        num_classes,
        kernel_initializer=keras.initializers.RandomNormal(stddev=0.01),
        kernel_regularizer=keras.regularizers.L2(decay),
        dtype="float32",
    )(x)


def cifar_resnet(depth: int, num_classes: int = 10, sync_batch_norm: bool = False) -> Any:
    """ResNet-(6n+2) for 32x32 inputs: 3 stages of n basic blocks, 16/32/64 filters."""
    import keras

    sync = sync_batch_norm
    blocks = (depth - 2) // 6
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.ReLU()(_bn(_conv(16, 3, 1, CIFAR_WEIGHT_DECAY)(inputs), sync))
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(blocks):
            strides = 2 if stage > 0 and block == 0 else 1
            x = _basic_block(x, filters, strides, CIFAR_WEIGHT_DECAY, sync)
    return keras.Model(inputs, _head(x, num_classes, CIFAR_WEIGHT_DECAY), name=f"resnet{depth}")


def resnet50(num_classes: int = 1001, image_size: int = 224, sync_batch_norm: bool = False) -> Any:
    """ResNet-50 v1.5: 7x7/2 stem, max pool, [3, 4, 6, 3] bottlenecks, 1001 logits."""
    import keras

    sync = sync_batch_norm
    inputs = keras.Input((image_size, image_size, 3))
    x = keras.layers.ReLU()(_bn(_conv(64, 7, 2, IMAGENET_WEIGHT_DECAY)(inputs), sync))
    x = keras.layers.MaxPooling2D(3, 2, padding="same")(x)
    for stage, (filters, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for block in range(blocks):
            strides = 2 if stage > 0 and block == 0 else 1
            x = _bottleneck(x, filters, strides, IMAGENET_WEIGHT_DECAY, sync)
    return keras.Model(inputs, _head(x, num_classes, IMAGENET_WEIGHT_DECAY), name="resnet50")


def _sgd(schedule: Any) -> Any:
    import keras

    return keras.optimizers.SGD(learning_rate=schedule, momentum=0.9)


def make_spec(config: TrainConfig) -> ModelSpec:
    """Model, data and schedule for ``--resnet_size`` (official schedules)."""
    from .data.splits import from_reader, synthetic_split

    size = int(flags.FLAGS.resnet_size)
    if size in IMAGENET_SIZES:
        return _imagenet_spec(config, int(flags.FLAGS.image_size))
    if size not in CIFAR_SIZES:
        raise InputError(
            "--resnet_size",
            size,
            "is not a supported depth",
            f"use one of {', '.join(map(str, CIFAR_SIZES + IMAGENET_SIZES))}",
        )
    shape = (32, 32, 3)
    if config.synthetic:
        split = synthetic_split(shape, 10, config.seed, SYNTHETIC_TRAIN, SYNTHETIC_EVAL)
    else:
        from .data import cifar

        data_dir = str(config.data_dir)
        sizes = cifar.num_examples(data_dir, True), cifar.num_examples(data_dir, False)
        split = from_reader(cifar.dataset, *sizes, data_dir=data_dir, seed=config.seed)
    return ModelSpec(
        name=f"resnet{size}",
        build_model=functools.partial(
            cifar_resnet, size, sync_batch_norm=bool(flags.FLAGS.sync_batch_norm)
        ),
        input_shape=shape,
        **split.spec_fields(),
        reference_batch=128,
        make_optimizer=_sgd,
        decay_epochs=(91, 136),
        replica_local_state=not flags.FLAGS.sync_batch_norm,
    )


def _imagenet_spec(config: TrainConfig, image_size: int) -> ModelSpec:
    from .data import imagenet
    from .data.splits import from_reader, synthetic_split

    shape = (image_size, image_size, 3)
    if config.synthetic:
        split = synthetic_split(
            shape, imagenet.NUM_CLASSES, config.seed, SYNTHETIC_TRAIN, SYNTHETIC_EVAL
        )
    else:
        data_dir = str(config.data_dir)
        train_files, eval_files = imagenet.files(data_dir, True), imagenet.files(data_dir, False)
        # The full official set has 1024/128 shards of known size; count anything else.
        n_train = (
            IMAGENET_TRAIN if len(train_files) == 1024 else imagenet.count_records(train_files)
        )
        n_eval = IMAGENET_EVAL if len(eval_files) == 128 else imagenet.count_records(eval_files)
        split = from_reader(
            imagenet.dataset, n_train, n_eval,
            data_dir=data_dir, seed=config.seed, image_size=image_size,
        )  # fmt: skip
    return ModelSpec(
        name="resnet50",
        build_model=functools.partial(
            resnet50,
            imagenet.NUM_CLASSES,
            image_size,
            sync_batch_norm=bool(flags.FLAGS.sync_batch_norm),
        ),
        input_shape=shape,
        **split.spec_fields(),
        reference_batch=256,
        make_optimizer=_sgd,
        decay_epochs=(30, 60, 80),
        replica_local_state=not flags.FLAGS.sync_batch_norm,
        warmup_epochs=5,
    )


# How users run it: `models.resnet` in a checkout, `slurmtf_models.resnet` installed (its
# `--help`, error prefixes and hints name the module that actually runs).
PROGRAM = __spec__.name if __spec__ is not None else "models.resnet"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m models.resnet`` (argv without the program name); returns the exit code."""
    size = _peek_size(argv)
    imagenet = size in IMAGENET_SIZES
    return train_main(
        PROGRAM,
        make_spec,
        argv,
        batch_size=256 if imagenet else 128,
        learning_rate=0.1,
    )


def _peek_size(argv: Sequence[str] | None) -> int:
    """The ``--resnet_size`` in argv (defaults need it before flags are parsed)."""
    args = list(sys.argv[1:] if argv is None else argv)
    for i, arg in enumerate(args):
        if arg.startswith("--resnet_size="):
            value = arg.split("=", 1)[1]
        elif arg == "--resnet_size" and i + 1 < len(args):
            value = args[i + 1]
        else:
            continue
        return int(value) if value.isdigit() else 0
    return 56


if __name__ == "__main__":
    sys.exit(main())
