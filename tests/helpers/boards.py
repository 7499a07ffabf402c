"""A TensorBoard run folder read back as TensorBoard reads it: its scalars and texts."""

from __future__ import annotations

from pathlib import Path


def read_run(folder: Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, list[str]]]:
    """Scalars (step, value) and texts per tag of one run folder, through TensorBoard."""
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.util import tensor_util

    acc = ea.EventAccumulator(str(folder), size_guidance={ea.TENSORS: 0})
    acc.Reload()
    scalars: dict[str, list[tuple[int, float]]] = {}
    texts: dict[str, list[str]] = {}
    for tag in acc.Tags()["tensors"]:
        for event in acc.Tensors(tag):
            value = tensor_util.make_ndarray(event.tensor_proto)
            if value.dtype.kind in "SO":
                texts.setdefault(tag, []).append(value.item().decode())
            else:
                scalars.setdefault(tag, []).append((event.step, float(value)))
    return scalars, texts
