"""Sharding and batching shared by the readers.

Every function takes the ``tf.distribute.InputContext`` of
``strategy.distribute_datasets_from_function`` and returns this worker's dataset, batched
with the PER-REPLICA batch and repeated forever (the loop counts steps).

Sharding by data interleaves elements: with 2 workers, worker 0 reads elements 0, 2, 4,
... and worker 1 reads 1, 3, 5, ...; each global step therefore covers the same examples
as one worker reading the global batch, which keeps 1-worker and N-worker runs equal.

The functions a pipeline maps are traced without AutoGraph (their control flow is
Python's): its rewrite took a third of the time a start spent building the
pipeline (0.14 s against 0.10 s for synthetic MNIST, TensorFlow 2.21).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from absl import logging

AUTOTUNE = -1  # tf.data.AUTOTUNE


def index_pipeline(
    num_examples: int,
    ctx: Any,
    batch: int,
    *,
    training: bool,
    seed: int,
    make_batch: Callable[[Any], tuple[Any, Any]],
    skip_batches: int = 0,
) -> Any:
    """Indices 0..n-1 (shuffled when training), sharded by data, batched, then looked up.

    ``make_batch`` maps a vector of int64 indices to ``(images, labels)``; an example
    depends only on its index, so the split over workers does not change the data.
    ``skip_batches`` drops that many batches of indices (cheap): a resumed run continues
    the exact stream an uninterrupted run would have read.
    """
    import tensorflow as tf

    ds = tf.data.Dataset.range(num_examples)
    if training:
        ds = ds.shuffle(num_examples, seed=seed, reshuffle_each_iteration=True)
    ds = ds.repeat()
    ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    ds = ds.skip(skip_batches * batch)
    ds = ds.batch(batch, drop_remainder=True)
    ds = ds.map(_plain(make_batch), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def file_pipeline(
    files: Sequence[str],
    ctx: Any,
    batch: int,
    *,
    training: bool,
    seed: int,
    read_file: Callable[[Any], Any],
    decode: Callable[[Any], tuple[Any, Any]],
    shuffle_buffer: int = 10_000,
    skip_batches: int = 0,
) -> Any:
    """Records from ``files``: sharded by files when there are at least as many files as
    workers, else by records; decoded in parallel, batched per replica, prefetched.

    Skipping records would mean reading them, so a resumed run (``skip_batches`` > 0)
    instead shuffles with a seed moved by ``skip_batches``: a new order, not a replay.
    """
    import tensorflow as tf

    seed += skip_batches
    n, index = ctx.num_input_pipelines, ctx.input_pipeline_id
    by_files = len(files) >= n
    fds = tf.data.Dataset.from_tensor_slices(list(files))
    if by_files and n > 1:
        fds = fds.shard(n, index)
    if training:
        fds = fds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    fds = fds.repeat()
    ds = fds.interleave(
        _plain(read_file),
        cycle_length=min(max(len(files) // max(n, 1), 1), 16),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    if not by_files:
        ds = ds.shard(n, index)
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed)
    ds = ds.map(_plain(decode), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(batch, drop_remainder=True)
    logging.info(
        "input: %d files, sharded by %s over %d workers (this is %d)",
        len(files),
        "files" if by_files else "records",
        n,
        index,
    )
    return ds.prefetch(tf.data.AUTOTUNE)


def _plain(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` as tf.data traces it, without AutoGraph (the module's docstring)."""
    import tensorflow as tf

    plain: Callable[..., Any] = tf.autograph.experimental.do_not_convert(function)
    return plain
