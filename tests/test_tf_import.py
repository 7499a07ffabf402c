"""TensorFlow imported without Keras for the check's probe and the servers: faster, and
``tf.keras`` still works when something asks for it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

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


def printed(script: str) -> list[str]:
    """The lines ``script`` prints in a fresh interpreter, which must succeed."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


@pytest.mark.tf
def test_tensorflow_without_keras_then_keras_on_first_use() -> None:
    lines = printed(SCRIPT)
    assert "held back: True []" in lines
    assert "sum: 64.0" in lines
    assert "keras on use: (1, 2)" in lines
    assert "same module again: True" in lines


MODEL_RANK = """
import importlib, importlib.util, sys
from slurmtf.tf import install
from slurmtf.tf.lean_import import KERAS_EXTRAS
tf = install.import_tensorflow()
print("keras:", "keras" in sys.modules)
print("extras:", sorted(m for m in sys.modules if m.split(".")[0] in KERAS_EXTRAS))
model = tf.keras.Sequential([tf.keras.layers.Dense(2)])
print("model:", model(tf.ones([1, 3])).shape)
for name in KERAS_EXTRAS:  # held during the import only
    if importlib.util.find_spec(name):
        print("after:", name, importlib.import_module(name).__name__ == name)
"""


@pytest.mark.tf
def test_a_model_rank_imports_keras_without_its_extras() -> None:
    """install.import_tensorflow: TensorFlow and Keras, without scikit-learn, IPython,
    pandas or matplotlib; each imports as usual afterwards."""
    from slurmtf.tf.lean_import import KERAS_EXTRAS

    lines = printed(MODEL_RANK)
    assert "keras: True" in lines
    assert "extras: []" in lines
    assert "model: (1, 2)" in lines
    installed = [name for name in KERAS_EXTRAS if importlib.util.find_spec(name)]
    assert installed, "none of Keras's extras is installed here: the check above proves nothing"
    for name in installed:
        assert f"after: {name} True" in lines, lines


def test_held_back_fails_imports_inside_the_block_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurmtf.tf.lean_import import held_back

    for name in ("pkg_held", "pkg_before"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("VALUE = 1\n")
        (tmp_path / name / "sub.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import pkg_before

    finders = list(sys.meta_path)
    with held_back(["pkg_held", "pkg_before"]):
        with pytest.raises(ImportError, match="held back"):
            import pkg_held
        import pkg_before.sub  # its package was imported before the block: not held

        assert pkg_before.sub.VALUE == 2
    assert sys.meta_path == finders
    import pkg_held.sub

    assert pkg_held.sub.VALUE == 2
    for name in ("pkg_held", "pkg_held.sub", "pkg_before", "pkg_before.sub"):
        monkeypatch.delitem(sys.modules, name)
