"""Synthetic, LEARNABLE data: each class has a coarse template; examples add fixed noise.

An example depends only on its index (label = index mod classes), so it is the same on
every worker whatever the sharding, and a model can learn it (loss falls), which makes
synthetic runs a real smoke test rather than noise.
"""

from __future__ import annotations

from typing import Any

from .common import index_pipeline

EVAL_OFFSET = 1_000_003  # eval indices never coincide with train indices
NOISE_POOL = 32


def dataset(
    ctx: Any,
    batch: int,
    *,
    shape: tuple[int, int, int],
    num_classes: int,
    num_examples: int,
    training: bool,
    seed: int,
    noise: float = 0.5,
    skip_batches: int = 0,
) -> Any:
    """This worker's synthetic dataset of ``(images[batch, *shape] float32, labels int32)``."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed + 12345)
    height, width, channels = shape
    coarse = rng.normal(size=(num_classes, 4, 4, channels)).astype(np.float32)
    templates = tf.constant(coarse)
    pool = tf.constant(
        (noise * rng.normal(size=(NOISE_POOL, height, width, channels))).astype(np.float32)
    )
    offset = 0 if training else EVAL_OFFSET

    def make_batch(indices: Any) -> tuple[Any, Any]:
        idx = indices + offset
        labels = tf.cast(idx % num_classes, tf.int32)
        base = tf.image.resize(tf.gather(templates, labels), (height, width), method="nearest")
        images = base + tf.gather(pool, (idx * 7 + idx // NOISE_POOL) % NOISE_POOL)
        return images, labels

    return index_pipeline(
        num_examples,
        ctx,
        batch,
        training=training,
        seed=seed,
        make_batch=make_batch,
        skip_batches=skip_batches,
    )
