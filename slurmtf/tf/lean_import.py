"""TensorFlow for processes that never build a Keras model (``slurmtf check``'s probe,
``slurmtf serve``'s servers), and Keras without its extras for a model's ranks.

``import tensorflow`` (2.21) imports all of Keras 3 eagerly (for its optimizers'
SavedModel registrations), and Keras imports scikit-learn, IPython and more of SciPy when they
are installed: about 40 % of the import's CPU time, paid by every rank of a check step
at its start (docs/BENCHMARKS.md). :func:`import_tensorflow_lean` imports TensorFlow
with Keras held back: TensorFlow's own ``try`` around that import skips it, and
``tf.keras`` still loads on first use, as it would without the eager import.

The bundled models' ranks need Keras but none of those extras: :func:`held_back` with
:data:`KERAS_EXTRAS` around their import (slurmtf.tf.install.import_tensorflow) saves
about 1.3 s of CPU and 165 MB a rank (2.21, docs/FAILURES.md), and so a part of every
restart. Keras's own ``try`` treats them as not installed; its scikit-learn wrappers say
so when used. They import as usual afterwards (an MLflow tracker's pandas, say).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

HELD_BACK = ("keras",)
# What Keras imports only when installed (each behind its own ``try``): its scikit-learn
# wrappers, notebook display, DataFrames as fit() input, the image-gallery plot.
KERAS_EXTRAS = ("sklearn", "IPython", "pandas", "matplotlib")


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


@contextmanager
def held_back(names: Sequence[str]) -> Iterator[None]:
    """Imports of the packages ``names`` (and their submodules) fail inside the block,
    unless a package is imported already; they import as usual afterwards."""
    finder = _HoldBack([n for n in names if n not in sys.modules])
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def import_tensorflow_lean() -> Any:
    """``tensorflow``, imported without Keras (or the module as it is, when a caller
    imported it before)."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    with held_back(HELD_BACK):
        import tensorflow as tf
    return tf
