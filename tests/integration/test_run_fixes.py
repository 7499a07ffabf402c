"""``python -m slurmtf.run``: the TensorFlow and Keras fixes are in place when the script
imports them, whichever it imports first, and only once.

A script that imports Keras before TensorFlow (Keras imports TensorFlow, which imports
parts of Keras) must find both fixes applied; one that then calls ``cluster_resolver()``
itself must not wrap Keras twice; with ``TF_USE_LEGACY_KERAS=1`` (``tf.keras`` is
``tf_keras``) the Keras 3 fixes stay off and the collective keys are still reused.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.tf]

REPO = Path(__file__).resolve().parents[2]
PROBE = """\
import json, sys
if sys.argv[1] == "keras-first":
    import keras
import tensorflow as tf
from tensorflow.python.distribute import cross_device_utils
seen = {"unique_keys": cross_device_utils.CollectiveReplicaLauncher._prefer_unique_instance_key}
import keras
seen["keras3"] = keras.__version__.startswith("3.")
seen["keras_fix"] = False
if seen["keras3"]:
    from keras.src.backend.tensorflow import trainer
    # patched on every Keras 3 release; the patch wraps it (functools.update_wrapper)
    seen["keras_fix"] = hasattr(trainer.reduce_per_replica, "__wrapped__")
if sys.argv[1] == "keras-first" and seen["keras3"]:
    from slurmtf.resolver import cluster_resolver
    cluster_resolver()
    reduce = trainer.reduce_per_replica
    seen["wrapped_twice"] = hasattr(reduce.__wrapped__, "__wrapped__")
print("SEEN", json.dumps(seen), flush=True)
"""


@pytest.mark.tf_core
@pytest.mark.parametrize(
    ("order", "legacy", "keras_fix"),
    [("keras-first", False, True), ("tensorflow-only", True, False)],
)
def test_fixes_are_applied_once_on_import(
    tmp_path: Path, order: str, legacy: bool, keras_fix: bool
) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    if legacy:
        env["TF_USE_LEGACY_KERAS"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "slurmtf.run", str(script), order],
        check=False, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("SEEN ")]
    seen = json.loads(line.removeprefix("SEEN "))
    assert seen["unique_keys"] is False, seen  # flat memory: keys reused
    # Keras 2 (TensorFlow 2.15's own tf.keras) runs model.fit under the strategy by itself.
    assert seen["keras_fix"] is (keras_fix and seen["keras3"]), seen
    assert seen.get("wrapped_twice", False) is False, seen
