"""Public API: the distributed custom training loop of the bundled models, for your model.

A script gives a :class:`ModelSpec` (how to build the Keras model and its optimizer,
and a dataset function) and calls :func:`main`; the loop adds everything the bundled
models have: the strategy choice (one device, mirrored GPUs, multi-worker over the Slurm
job, from :mod:`slurmtf.resolver`), per-worker input sharding, checkpoints written by the
chief and resumed from, save-and-exit-75 on the preemption signal (the job script or
submitter requeues), JSON event lines and progress on the chief, per-rank logs, and a
watchdog that ends a stalled run with a line naming the stuck rank::

    from slurmtf import train

    def make_spec(config: train.TrainConfig) -> train.ModelSpec:
        return train.ModelSpec(
            name="mine", build_model=build_model, input_shape=(20,),
            train_dataset=lambda ctx, batch, skip_batches=0: train.shard_and_batch(
                my_dataset(), ctx, batch, skip_batches),
            eval_dataset=..., num_train_examples=2048, num_eval_examples=512,
            reference_batch=64, make_optimizer=lambda lr: keras.optimizers.SGD(lr),
            own_data=True)

    if __name__ == "__main__":
        sys.exit(train.main("my_train", make_spec, batch_size=64, learning_rate=0.1))

Flags are the bundled models' (``--model_dir``, ``--train_steps``, ``--batch_size`` (the
GLOBAL batch), ``--preemption_signal``, ``--stall_timeout``, ... see docs/MODELS.md);
``python my_train.py --help`` lists them. What the loop trains: a classifier with integer
labels and logits (sparse categorical cross-entropy, accuracy); docs/BRING_YOUR_OWN.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from slurmtf.contracts import EXIT_PREEMPTED
from slurmtf.training.app import main_for
from slurmtf.training.flags import TrainConfig
from slurmtf.training.loop import ModelSpec, weights_checksum

__all__ = [
    "EXIT_PREEMPTED",
    "ModelSpec",
    "TrainConfig",
    "main",
    "shard_and_batch",
    "weights_checksum",
]


def main(
    program: str,
    make_spec: Callable[[TrainConfig], ModelSpec],
    argv: Sequence[str] | None = None,
    *,
    batch_size: int,
    learning_rate: float,
) -> int:
    """Parse the training flags from ``argv`` (``sys.argv[1:]`` when ``None``), build the
    spec and train; returns the exit code (0 done, 75 preempted after saving, 2 bad
    flag, 1 a peer failed or stalled).

    ``batch_size`` and ``learning_rate`` are the defaults of ``--batch_size`` (global)
    and ``--learning_rate`` (for ``reference_batch``; scaled linearly with the batch).
    Define your own absl flags before calling it; ``program`` names the script in errors.
    In a multi-worker job a finished or preempted process ends inside this call, once
    every rank is done (:func:`slurmtf.runtime.rank.teardown.leave_together`), with that exit code.
    """
    return main_for(
        program,
        argv,
        make_spec,
        default_batch_size=batch_size,
        default_learning_rate=learning_rate,
    )


def shard_and_batch(dataset: Any, ctx: Any, per_replica_batch: int, skip_batches: int = 0) -> Any:
    """This worker's part of ``dataset`` as the loop wants it: the dataset function's body.

    Shards by element (worker ``i`` of ``n`` reads elements ``i, i+n, ...``, so a global
    step covers the same examples as one worker reading the global batch), repeats,
    skips ``skip_batches`` batches (a resumed run continues the stream), batches per
    replica and prefetches. ``ctx`` is the ``tf.distribute.InputContext`` the loop passes.
    Shuffle ``dataset`` before, with a fixed seed, so every worker shuffles alike.
    """
    import tensorflow as tf

    ds = dataset.repeat().shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    ds = ds.skip(skip_batches * per_replica_batch)
    return ds.batch(per_replica_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
