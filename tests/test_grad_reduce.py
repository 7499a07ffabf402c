"""Gradient compression (``--allreduce_dtype``) and packing (``--bytes_per_pack``).

Unit tests of the pure parts, then real runs: 2 workers all-reducing bf16 gradients
follow the loss curve of 1 worker in fp32, and fp16 (scaled) on 2 CPU replicas too.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from slurmtf.errors import InputError
from slurmtf.training.flags import TrainConfig
from slurmtf.training.grad_reduce import FP16_TARGET, GradReduce, fp16_scales
from tests.helpers.datafiles import write_mnist
from tests.helpers.localjobs import REPO, Job

# A compressed run may differ from fp32 by this much in the loss at every logged step
# (relative, or LOSS_ATOL absolute). bf16 keeps 8 bits of mantissa: each summed
# gradient is off by <= 2**-8 relative. Weights are not compared element by element:
# Adam turns the rounding of near-zero gradients into steps of up to the learning rate
# (measured: 0.03 after 12 steps).
LOSS_RTOL = 0.03
LOSS_ATOL = 0.01  # the tiny data set is learnt: late losses are ~0.003


def test_spec_validation_and_default() -> None:
    assert GradReduce() == GradReduce("fp32", 0)
    with pytest.raises(InputError, match=r"--allreduce_dtype.*HINT: use fp32, bf16 or fp16"):
        GradReduce("int8")
    with pytest.raises(InputError, match="--bytes_per_pack"):
        TrainConfig(bytes_per_pack=-1)


# (bound, the exponent of fp16_scales' scale): 2**14 the target, clipped at +-100, 0 (a
# scale of 1) for bounds that are zero, negative, not finite, or subnormal in fp32 (1e-40,
# 1e-38: flushed to zero by TensorFlow's CPU kernels).
FP16_BOUNDS = [
    (1.0, 14), (3e-7, 35), (FP16_TARGET, 0), (1e5, -3), (1e30, -86), (3e38, -100),
    (1e-30, 100), (0.0, 0), (-1.0, 0), (math.inf, 0), (-math.inf, 0), (math.nan, 0),
    (1e-38, 0), (1e-40, 0),
]  # fmt: skip


@pytest.mark.tf
def test_fp16_scales() -> None:
    import tensorflow as tf

    bounds = [bound for bound, _ in FP16_BOUNDS]
    scales = fp16_scales(tf.constant(bounds, tf.float32)).numpy().tolist()
    assert [math.log2(s) for s in scales] == [exponent for _, exponent in FP16_BOUNDS]
    for bound, scale in zip(bounds, scales, strict=True):
        if 1e-30 < bound < 1e30:
            assert FP16_TARGET / 2 < bound * scale <= FP16_TARGET  # as large as safe, no more


_TWO_REPLICAS = """
import numpy as np
import tensorflow as tf

from slurmtf.training.grad_reduce import GradReduce, all_reduce

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
tiny = np.array([1e-9, -3e-10, 0.0], np.float32)  # fp16 alone flushes these to 0
huge = np.array([1e5, -7e4, 1.0], np.float32)  # fp16 alone overflows these


def replica(dtype):
    return all_reduce([tf.constant(tiny), tf.constant(huge)], GradReduce(dtype))


for dtype in ("fp16", "bf16", "fp32"):
    out = strategy.experimental_local_results(strategy.run(replica, args=(dtype,)))[0]
    rtol = 2e-3 if dtype == "fp16" else 1e-2
    np.testing.assert_allclose(out[0].numpy(), 2 * tiny, rtol=rtol, err_msg=dtype)
    np.testing.assert_allclose(out[1].numpy(), 2 * huge, rtol=rtol, err_msg=dtype)
# Packing changes how gradients travel, never the sum: exactly equal to one pack.
rng = np.random.default_rng(3)
grads = [tf.constant(rng.normal(size=(i + 1, 7)), tf.float32) for i in range(9)]
for dtype in ("fp32", "bf16", "fp16"):
    one, many = (
        strategy.experimental_local_results(
            strategy.run(lambda: all_reduce(grads, GradReduce(dtype, pack)))
        )[0]
        for pack in (0, 64)
    )
    for a, b in zip(one, many, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=dtype)
print("SUMS OK")
"""


@pytest.mark.tf
def test_fp16_keeps_tiny_and_huge_gradients() -> None:
    """Two replicas in one process: fp16 sums equal fp32 sums to fp16 precision.

    A fresh interpreter: the CPU can be split into two devices only before TensorFlow
    has started, which other tests in this process may already have done.
    """
    done = subprocess.run(
        [sys.executable, "-c", _TWO_REPLICAS], cwd=REPO, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr[-3000:]
    assert done.returncode == 0, output
    assert "SUMS OK" in done.stdout, output


@pytest.mark.tf_core
@pytest.mark.tf
@pytest.mark.slow
def test_compressed_runs_follow_the_fp32_loss_curve(tmp_path: Path) -> None:
    data = write_mnist(tmp_path / "mnist", n_train=96, n_eval=32)
    common = ["--data_dir", str(data), "--batch_size=16", "--train_steps=10", "--seed=7",
              "--dropout_rate=0", "--learning_rate=0.02", "--log_every=2",
              "--eval_steps=1"]  # fmt: skip
    fp16 = ["--cpu_replicas=2", "--allreduce_dtype=fp16", "--bytes_per_pack=4096"]
    runs = {
        "fp32": Job(tmp_path, 1, "fp32").start("mnist", [*common, f"--model_dir={tmp_path}/a"]),
        "bf16": Job(tmp_path, 2, "bf16").start(
            "mnist", [*common, "--allreduce_dtype=bf16", f"--model_dir={tmp_path}/b"]
        ),
        "fp16": Job(tmp_path, 1, "fp16").start(
            "mnist", [*common, *fp16, f"--model_dir={tmp_path}/c"]
        ),
    }
    try:
        for name, job in runs.items():
            assert job.wait(300) == [0] * job.size, f"{name}\n{job.logs()}"
    finally:
        for job in runs.values():
            job.kill()
    curves = {n: [e["loss"] for e in j.events(0, "progress")] for n, j in runs.items()}
    assert len(curves["fp32"]) == 5, runs["fp32"].stdout(0)
    assert curves["fp32"][-1] < 0.7 * curves["fp32"][0]  # a curve worth following
    for name in ("bf16", "fp16"):
        pairs = list(zip(curves[name], curves["fp32"], strict=True))
        print(f"{name} vs fp32 loss: {pairs}")
        np.testing.assert_allclose(
            curves[name], curves["fp32"], rtol=LOSS_RTOL, atol=LOSS_ATOL, err_msg=name
        )
    bf16 = runs["bf16"]
    assert bf16.done(0)["weights_checksum"] == bf16.done(1)["weights_checksum"]  # ranks agree
