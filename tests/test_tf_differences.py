"""The TensorFlow release differences of slurmtf.tf, without TensorFlow."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from slurmtf.tf import coordination

COLLECTIVE, REMOTE = object(), object()


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        ({"_collective_ops_server_def": COLLECTIVE, "_server_def": None}, COLLECTIVE),
        ({"_collective_ops_server_def": None, "_server_def": REMOTE}, REMOTE),
        ({"_server_def": REMOTE}, REMOTE),  # a release without the collective ops' one
        ({"_collective_ops_server_def": None, "_server_def": None}, None),
        ({}, None),
    ],
)
def test_the_server_def_is_collective_ops_else_remote_eager(
    attributes: dict[str, object], expected: object
) -> None:
    assert coordination.server_def(SimpleNamespace(**attributes)) is expected
