"""TensorFlow for processes that never build a Keras model: ``slurmtf check``'s probe
and ``slurmtf serve``'s servers.

``import tensorflow`` (2.21) imports all of Keras 3 eagerly (for its optimizers'
SavedModel registrations), and Keras imports scikit-learn, IPython and more of SciPy when they
are installed: about 40 % of the import's CPU time, paid by every rank of a check step
at its start (docs/BENCHMARKS.md). :func:`import_tensorflow_lean` imports TensorFlow
with Keras held back: TensorFlow's own ``try`` around that import skips it, and
``tf.keras`` still loads on first use, as it would without the eager import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

HELD_BACK = ("keras",)


class _NotNow(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        raise ImportError(f"{spec.name} is held back while TensorFlow is imported")

    def exec_module(self, module: ModuleType) -> None:  # never reached
        raise ImportError(module.__name__)


class _HoldBack(importlib.abc.MetaPathFinder):
    """Finds the held-back packages where they are (so their location can be read) but
    refuses to load them."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None:
            spec.loader = _NotNow()
        return spec


def import_tensorflow_lean() -> Any:
    """``tensorflow``, imported without Keras (or the module as it is, when a caller
    imported it before)."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    finder = _HoldBack(HELD_BACK)
    sys.meta_path.insert(0, finder)
    try:
        import tensorflow as tf
    finally:
        sys.meta_path.remove(finder)
    return tf
