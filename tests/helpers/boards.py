"""A TensorBoard run folder read back as TensorBoard reads it: its scalars and texts."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any


def accumulator(folder: Path) -> Any:
    """TensorBoard's ``EventAccumulator`` of ``folder``, loaded, on TensorBoard's own
    TensorFlow stub as ``slurmtf tensorboard`` runs it (``board.NOTF_MAIN``): through its
    file layer it would import TensorFlow into the test's process (seconds to import and
    about 8 s more at the process's exit)."""
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("notf"))
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(folder), size_guidance={ea.TENSORS: 0})
    acc.Reload()
    return acc


def read_run(folder: Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, list[str]]]:
    """Scalars (step, value) and texts per tag of one run folder, through TensorBoard."""
    from tensorboard.util import tensor_util

    acc = accumulator(folder)
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
