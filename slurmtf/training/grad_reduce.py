"""Gradient all-reduce in a smaller dtype, packed, for links that are the bottleneck.

``--allreduce_dtype=bf16`` halves the bytes every step sends: gradients are cast to
bfloat16 (fp32's exponent range, so nothing flushes to zero or overflows), summed over
the replicas and cast back. ``fp16`` keeps 3 more mantissa bits but only 5 exponent
bits, so each tensor is first multiplied by a power of two chosen from a bound on its
summed magnitude (one extra all-reduce of one float per tensor): the largest sum lands
near 2**14, far below fp16's 65504, and gradients down to ~2**-24 of a tensor's largest
survive. ``--bytes_per_pack`` splits the all-reduce into packs of that size
(``tf.distribute.experimental.CommunicationOptions``; 0 = one pack).

Every training step all-reduces here, so that no variable changes before every
gradient is summed (slurmtf.training.steps), and Keras's own all-reduce is switched off
for the training optimizer (Keras 3 has no ``skip_gradients_aggregation``; its TF
optimizer sums gradients in ``_all_reduce_sum_gradients``, which
:func:`slurmtf.tf.compat.bypass_gradient_sum` bypasses).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from slurmtf.errors import InputError, SlurmtfError
from slurmtf.tf import compat

DTYPES = ("fp32", "bf16", "fp16")
# fp16 sums are scaled so their bound is at most this (fp16's largest value is 65504).
FP16_TARGET = 2.0**14
_MAX_EXPONENT = 100.0  # 2**100 is far inside fp32's range


@dataclasses.dataclass(frozen=True)
class GradReduce:
    """How gradients cross the network: ``dtype`` on the wire and ``bytes_per_pack``."""

    dtype: str = "fp32"
    bytes_per_pack: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise InputError(
                "--allreduce_dtype", self.dtype, "is not a wire dtype", "use fp32, bf16 or fp16"
            )
        if self.bytes_per_pack < 0:
            raise InputError(
                "--bytes_per_pack", self.bytes_per_pack, "must not be negative", "0 = one pack"
            )


def fp16_scales(bound: Any) -> Any:
    """The powers of two that scale sums bounded by ``bound`` (a float32 tensor, one bound
    per tensor) into fp16 safely: the largest with ``bound * scale <= FP16_TARGET``, within
    2**-100..2**100; 1 for a bound that is zero, negative or not finite.

    A subnormal float32 bound (below ~1.2e-38) counts as zero where TensorFlow flushes
    subnormals (its CPU kernels do): scale 1. Its gradients are lost in fp16 either way,
    since even 2**100 leaves them below fp16's smallest value (2**-24)."""
    import tensorflow as tf

    ok = tf.math.logical_and(tf.math.is_finite(bound), bound > 0)
    safe = tf.where(ok, bound, FP16_TARGET)
    exp = tf.floor(tf.math.log(FP16_TARGET / safe) / math.log(2.0))
    return tf.pow(2.0, tf.clip_by_value(exp, -_MAX_EXPONENT, _MAX_EXPONENT))


def all_reduce(grads: Sequence[Any], spec: GradReduce) -> list[Any]:
    """Sum ``grads`` over the replicas (call in a replica context) as ``spec`` says."""
    import tensorflow as tf

    ctx = tf.distribute.get_replica_context()
    options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=spec.bytes_per_pack)
    dense = [tf.convert_to_tensor(g) for g in grads]
    total = tf.distribute.ReduceOp.SUM
    if spec.dtype == "fp32":
        return list(ctx.all_reduce(total, dense, options=options))
    if spec.dtype == "bf16":
        summed = ctx.all_reduce(total, [tf.cast(g, tf.bfloat16) for g in dense], options=options)
        return [tf.cast(s, g.dtype) for s, g in zip(summed, dense, strict=True)]
    wide = [tf.cast(g, tf.float32) for g in dense]
    local_max = tf.stack([tf.reduce_max(tf.abs(g)) for g in wide])
    # The sum of every replica's largest |g| bounds every element of the summed tensor
    # (and every partial sum on the way), so the scaled fp16 sum cannot overflow.
    scales = tf.unstack(fp16_scales(ctx.all_reduce(total, local_max, options=options)))
    packed = [tf.cast(g * s, tf.float16) for g, s in zip(wide, scales, strict=True)]
    summed = ctx.all_reduce(total, packed, options=options)
    return [
        tf.cast(tf.cast(x, tf.float32) / s, g.dtype)
        for x, s, g in zip(summed, scales, dense, strict=True)
    ]


def take_over_reduction(optimizer: Any, spec: GradReduce) -> None:
    """Switch off the optimizer's own gradient all-reduce (``spec`` names it in errors).

    Done once, before tracing: replicas of one process (MirroredStrategy) trace the step
    in parallel threads, so the switch cannot be flipped around each call. The optimizer
    then expects summed gradients (:func:`all_reduce`). Fails if Keras has no such hook,
    rather than letting gradients be summed twice.
    """
    if compat.skips_aggregation(optimizer):
        return  # Keras 2: apply_gradients is told instead (slurmtf.tf.compat.apply_gradients)
    if not compat.bypass_gradient_sum(optimizer):
        raise SlurmtfError(
            f"--allreduce_dtype={spec.dtype} --bytes_per_pack={spec.bytes_per_pack}: this Keras "
            f"optimizer ({type(optimizer).__name__}) has no gradient sum to bypass, so "
            "gradients would be summed twice. HINT: use --allreduce_dtype=fp32 --bytes_per_pack=0"
        )
