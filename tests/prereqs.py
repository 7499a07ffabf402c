"""Shared test helpers: prerequisite checks that fail (not skip) in CI."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version

import pytest


def require(condition: bool, reason: str) -> None:
    """Skip when a prerequisite is missing; fail instead under SLURMTF_STRICT_PREREQS=1.

    The test command installs every prerequisite and sets the variable, so there a
    missing one is a real failure rather than a silently skipped test.
    """
    if condition:
        return
    if os.environ.get("SLURMTF_STRICT_PREREQS") == "1":
        pytest.fail(f"missing prerequisite: {reason}")
    pytest.skip(f"missing prerequisite: {reason}")


def keras_2() -> bool:
    """Whether this interpreter's Keras is Keras 2 (TensorFlow 2.15), read from its
    package metadata without importing it; Keras 3 when there is none."""
    try:
        return int(version("keras").split(".")[0]) < 3
    except (PackageNotFoundError, ValueError):
        return False
