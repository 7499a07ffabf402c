"""An embedding table sharded over the ps tasks, trained with ParameterServerStrategy.

    sbatch jobs/parameter_server.sbatch examples/parameter_server.py --train_steps=60
    slurmtf submit --command="python examples/parameter_server.py" --jobs=chief:1,ps:2,worker:2 \\
        --nodes=3 --time=10

Runs on the chief (the coordinator) of a job whose ps and worker tasks run ``slurmtf
serve`` (docs/BRING_YOUR_OWN.md, "Parameter servers"). The model is low-level TensorFlow
(``tf.Module``, plain SGD): Keras 3 does not train under ParameterServerStrategy. The
table ``[--vocab, --dim]`` is split over the ps tasks by a ``MinSizePartitioner``;
each step is a function the ``ClusterCoordinator`` schedules on whichever worker is free,
reading its own per-worker dataset. A worker that dies is tolerated: the coordinator runs
its functions on the others. A ps that dies fails the script (no state without it); the
job restarts from the last checkpoint in ``MODEL_DIR`` (every ``--checkpoint_every``
steps). On USR2 (the preemption signal) it saves and exits 75, and the job is requeued.

Event lines (:mod:`slurmtf.events`): ``cluster`` once, ``progress`` every ``--log_every``
steps, ``checkpoint`` per save, ``done`` at the end (``first_loss``, ``last_loss``,
``start_step``, ``preempted``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from slurmtf.contracts import EXIT_PREEMPTED
from slurmtf.events import emit


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_steps", type=int, default=60)
    parser.add_argument("--batch_size", type=int, default=64, help="per worker and step")
    parser.add_argument("--vocab", type=int, default=100)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=5.0)
    parser.add_argument("--log_every", type=int, default=5)
    parser.add_argument("--checkpoint_every", type=int, default=10)
    parser.add_argument("--step_delay", type=float, default=0.0, help="s to sleep per step")
    parser.add_argument("--model_dir", default=os.environ.get("MODEL_DIR"))
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def make_model(tf: Any, args: argparse.Namespace) -> Any:
    """Embedding -> dot product with one weight vector -> a logit per id."""

    class Model(tf.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            init = tf.random.stateless_uniform([args.vocab, args.dim], [args.seed, 0], -0.1, 0.1)
            self.table = tf.Variable(init, name="table")  # sharded by the partitioner
            self.w = tf.Variable(tf.fill([args.dim], 0.1), name="w")
            self.b = tf.Variable(0.0, name="b")

        @property
        def params(self) -> list[Any]:
            """The variables to update, a sharded one as its shards."""
            found = []
            for var in (self.table, self.w, self.b):
                found.extend([var] if isinstance(var, tf.Variable) else var.variables)
            return found

        def __call__(self, ids: Any) -> Any:
            return tf.linalg.matvec(tf.nn.embedding_lookup(self.table, ids), self.w) + self.b

    return Model()


def make_dataset_fn(tf: Any, args: argparse.Namespace) -> Any:
    """Endless batches of (id, label); the label is a fixed function of the id."""

    def dataset_fn() -> Any:
        ids = tf.data.Dataset.random(seed=args.seed).map(lambda x: x % args.vocab)
        pairs = ids.map(lambda i: (i, tf.cast((i * 7919) % 3 == 0, tf.float32)))
        return pairs.batch(args.batch_size, drop_remainder=True).prefetch(2)

    return dataset_fn


def make_train_step(tf: Any, strategy: Any, model: Any, lr: float) -> Any:
    @tf.function
    def train_step(iterator: Any) -> Any:
        def replica_fn(batch: Any) -> Any:
            ids, labels = batch
            with tf.GradientTape() as tape:
                logits = model(ids)
                loss = tf.reduce_mean(
                    tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
                )
            for var, grad in zip(model.params, tape.gradient(loss, model.params), strict=True):
                if isinstance(grad, tf.IndexedSlices):
                    var.scatter_sub(tf.IndexedSlices(lr * grad.values, grad.indices))
                else:
                    var.assign_sub(lr * grad)
            return loss

        return strategy.run(replica_fn, args=(next(iterator),))

    return train_step


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    import tensorflow as tf

    from slurmtf.resolver import cluster_resolver
    from slurmtf.training.checkpoints import Checkpointer
    from slurmtf.training.preemption import PreemptionWatcher

    resolver = cluster_resolver(keras_fit=False, flat_memory=False)
    num_ps = len(resolver.cluster_spec().as_dict().get("ps", []))
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver,
        # Variables of 1 KiB and more (the table) are split over the ps tasks.
        variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=1 << 10, max_shards=max(num_ps, 1)
        ),
    )
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    preemption = PreemptionWatcher("USR2").install()
    with strategy.scope():
        model = make_model(tf, args)
    step_var = tf.Variable(0, dtype=tf.int64)  # on the chief: where the run is
    ckpt = Checkpointer(args.model_dir, True, {"model": model, "step": step_var})
    restored = ckpt.restore_latest()
    start = int(step_var.numpy())
    cluster = resolver.cluster_spec().as_dict()
    emit(
        "cluster",
        rank=0,
        num_workers=len(cluster.get("worker", [])),
        workers=list(cluster.get("worker", [])),
        ps=list(cluster.get("ps", [])),
        strategy="ParameterServerStrategy",
        table_shards=len(model.table.variables),
        restored=restored,
        restart_count=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
    )
    iterator = iter(coordinator.create_per_worker_dataset(make_dataset_fn(tf, args)))
    train_step = make_train_step(tf, strategy, model, args.learning_rate)
    first_loss, last_loss, step, preempted = train(
        args,
        coordinator=coordinator,
        train_step=train_step,
        iterator=iterator,
        start=start,
        preemption=preemption,
        ckpt=ckpt,
        step_var=step_var,
    )
    emit(
        "done",
        rank=0,
        step=step,
        start_step=start,
        first_loss=first_loss,
        last_loss=last_loss,
        preempted=preempted,
    )
    return EXIT_PREEMPTED if preempted else 0


def train(
    args: argparse.Namespace,
    *,
    coordinator: Any,
    train_step: Any,
    iterator: Any,
    start: int,
    preemption: Any,
    ckpt: Any,
    step_var: Any,
) -> tuple[float | None, float | None, int, bool]:
    """Schedule the steps; every ``--log_every`` join and report, save when due."""
    first: float | None = None
    last: float | None = None
    step, pending, began = start, [], time.monotonic()
    while step < args.train_steps and not preemption.requested:
        pending.append(coordinator.schedule(train_step, args=(iterator,)))
        step += 1
        if args.step_delay:
            time.sleep(args.step_delay)
        if step % args.log_every and step < args.train_steps:
            continue
        coordinator.join()
        losses = [float(value.fetch()) for value in pending]
        pending = []
        last = sum(losses) / len(losses)
        first = last if first is None else first
        rate = args.log_every * args.batch_size / max(time.monotonic() - began, 1e-9)
        emit("progress", step=step, total=args.train_steps, loss=last, examples_per_sec=rate)
        print(f"step {step}/{args.train_steps} loss {last:.4f}", file=sys.stderr, flush=True)
        began = time.monotonic()
        if step % args.checkpoint_every == 0 or step == args.train_steps:
            save(ckpt, step_var, step)
    if preemption.requested:
        coordinator.join()
        save(ckpt, step_var, step)
        emit("preempted", step=step)
    return first, last, step, preemption.requested


def save(ckpt: Any, step_var: Any, step: int) -> None:
    step_var.assign(step)
    path = ckpt.save(step)
    if path:
        emit("checkpoint", step=step, path=path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
