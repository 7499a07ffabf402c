"""TensorFlow imported without Keras for the check's probe and the servers: faster, and
``tf.keras`` still works when something asks for it."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys
from slurmtf.tf.lean_import import import_tensorflow_lean
tf = import_tensorflow_lean()
held = sorted(m for m in sys.modules if m.split(".")[0] in ("keras", "sklearn", "IPython"))
print("held back:", not held, held[:3])
print("sum:", float(tf.reduce_sum(tf.linalg.matmul(tf.ones([4, 4]), tf.ones([4, 4])))))
assert not [f for f in sys.meta_path if type(f).__name__ == "_HoldBack"], "finder left in"
print("keras on use:", tf.keras.layers.Dense(2)(tf.ones([1, 3])).shape)
print("same module again:", import_tensorflow_lean() is tf)
"""


@pytest.mark.tf
def test_tensorflow_without_keras_then_keras_on_first_use() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "held back: True []" in lines
    assert "sum: 64.0" in lines
    assert "keras on use: (1, 2)" in lines
    assert "same module again: True" in lines
