"""Chief-only outputs: TensorBoard summaries and the SavedModel export."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from absl import logging

from slurmtf.tf import compat
from slurmtf.training.trackers import CLOSE_WAIT_S, Trackers


class Summaries:
    """TensorBoard scalars under ``<model_dir>/{train,eval}``, a no-op off the chief; the
    same scalars to ``trackers`` (the user's MLflow and W&B runs), when given."""

    def __init__(
        self,
        model_dir: str | None,
        is_chief: bool,
        splits: tuple[str, ...] = ("train", "eval"),
        trackers: Trackers | None = None,
    ) -> None:
        import tensorflow as tf

        self._tf = tf
        self.trackers = trackers or Trackers()
        self._writers: dict[str, Any] = {}
        self.enabled = bool(model_dir) and is_chief
        from tensorflow.core.framework import summary_pb2

        self._metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
        ).SerializeToString()
        self._text_metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text")
        ).SerializeToString()
        if self.enabled:
            for split in splits:
                self._writers[split] = tf.summary.create_file_writer(
                    str(Path(str(model_dir)) / split)
                )

    def scalars(self, split: str, step: int, values: dict[str, float]) -> None:
        self.trackers.log(split, step, values)
        if not self.enabled or split not in self._writers:
            return
        tf = self._tf
        with self._writers[split].as_default():
            for name, value in values.items():
                # tf.summary.write, not tf.summary.scalar: the latter needs the tensorboard
                # package, which TensorFlow 2.21 no longer installs.
                tf.summary.write(
                    name, tf.constant(value, tf.float32), step=step, metadata=self._metadata
                )
        self._writers[split].flush()

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Send what the trackers still hold (at most ``wait_s`` s) and end their runs;
        close the writers."""
        self.trackers.close(wait_s)
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def text(self, split: str, step: int, tag: str, value: str) -> None:
        """One text summary (TensorBoard's Text dashboard)."""
        if not self.enabled or split not in self._writers:
            return
        tf = self._tf
        with self._writers[split].as_default():
            tf.summary.write(tag, tf.constant(value), step=step, metadata=self._text_metadata)
        self._writers[split].flush()


class AllocationWriter:
    """:class:`slurmtf.training.allocation.Writer` on ``<model_dir>/allocation`` (chief)."""

    SPLIT = "allocation"

    def __init__(self, model_dir: str) -> None:
        self.summaries = Summaries(model_dir, True, (self.SPLIT,))

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.summaries.scalars(self.SPLIT, step, dict(values))

    def text(self, tag: str, step: int, value: str) -> None:
        self.summaries.text(self.SPLIT, step, tag, value)


def export_saved_model(
    export_dir: str, build_model: Callable[[], Any], trained: Any, input_shape: tuple[int, ...]
) -> str:
    """Write a SavedModel of ``trained``'s weights (chief only; outside any strategy).

    A fresh model is built under the default strategy and given the trained weights, so
    exporting needs no collective and other ranks need not take part.
    """
    import tensorflow as tf

    started = time.monotonic()
    weights = compat.local_weights(trained)  # no collective: the other ranks are not here
    with tf.distribute.get_strategy().scope():
        fresh = build_model()
        fresh(tf.zeros((1, *input_shape)), training=False)
        fresh.set_weights(weights)
    absl_logger = logging.get_absl_logger()
    level = absl_logger.level
    try:
        compat.export_saved_model(fresh, export_dir)
    finally:
        absl_logger.setLevel(level)  # Keras's verbose=False leaves absl at WARNING
    logging.info("Exported SavedModel to %s in %.1f s", export_dir, time.monotonic() - started)
    return export_dir
