"""GPU throughput: ResNet-50 v1.5 images/s, the TFRecord input pipeline, MNIST steps/s, NCCL.

Needs a GPU and the CUDA build of TensorFlow (``pip install -e '.[gpu,dev]'``). Without a
GPU it reports itself PENDING with the command to run, and run_all keeps any measured
``gpu.json`` it finds. Everything runs in one child process (``--worker``):

1. ResNet-50 v1.5 (``models.resnet.resnet50``), batch 256, synthetic data resident on the
   GPU, for bf16 + XLA, fp16 + XLA (loss scaling) and fp32: images/s of the full train
   step, and where a step's time goes (forward, backward, optimizer update, from timing
   the three nested functions), plus a TensorBoard profile of a few steps.
2. The same model through the project's training loop (``python -m models.resnet
   --resnet_size=50 --use_synthetic_data --dtype=bf16 --enable_xla``): what users get.
3. The input pipeline (``models.data.imagenet.dataset``) on TFRecords in the official
   ImageNet format written here (random JPEGs ~500x375): images/s decoded and augmented.
4. MNIST steps/s through ``python -m models.mnist``.
5. NCCL all-reduce bus bandwidth between the GPUs of this node (needs 2 or more GPUs).

NVIDIA publishes 2,375 images/s for TensorFlow ResNet-50 on one A100 (AMP + XLA); the
target here is at least 4,000 images/s on one H100.

    python -m benchmarks.bench_gpu [--quick]                   # on a machine with a GPU
    python -m benchmarks.bench_gpu --worker --allow_cpu --smoke  # code-path check on CPU
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness, protocol
from benchmarks.harness import JSONDict
from benchmarks.protocol import Benchmark, Options
from slurmtf.events import emit, parse_events
from slurmtf.tf import compat

COMMAND = (
    "pip install -e '.[gpu,dev]'   # CUDA build of TensorFlow\n"
    "python -m benchmarks.run_all --only gpu,projection   # writes docs/benchmarks/gpu.json"
)
A100_PUBLISHED_IMG_S = 2375.0
H100_TARGET_IMG_S = 4000.0
CONFIGS = (("bf16", True), ("fp16", True), ("fp32", False))
POLICIES = {"fp32": "float32", "fp16": "mixed_float16", "bf16": "mixed_bfloat16"}


def gpu_names() -> list[str]:
    """GPUs ``nvidia-smi -L`` lists; empty without a driver or GPU."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in done.stdout.splitlines() if line.startswith("GPU ")]


# ---------------------------------------------------------------------------- in the worker
def _emit(kind: str, **fields: Any) -> None:
    emit(kind, **fields)


def resnet_compute(
    dtype: str, xla: bool, *, batch: int, steps: int, warmup: int, image: int, profile: str | None
) -> JSONDict:
    """images/s of the ResNet-50 train step on device-resident data, and its breakdown."""
    import keras
    import tensorflow as tf

    from models.resnet import resnet50

    compat.set_precision_policy(keras, POLICIES[dtype])
    model = resnet50(image_size=image)
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    if dtype == "fp16":
        optimizer = compat.loss_scale_optimizer(keras, optimizer)
    optimizer.build(model.trainable_variables)
    x = tf.random.uniform([batch, image, image, 3])
    y = tf.random.uniform([batch], maxval=1000, dtype=tf.int32)
    params = model.trainable_variables

    def forward(x: Any, y: Any) -> Any:
        logits = tf.cast(model(x, training=True), tf.float32)
        losses = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
        return tf.reduce_mean(losses)

    def forward_backward(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = forward(x, y)
            scaled = compat.scale_loss(optimizer, loss)
        return loss, compat.unscale_gradients(optimizer, tape.gradient(scaled, params))

    fwd = tf.function(forward, jit_compile=xla)
    fwd_bwd = tf.function(forward_backward, jit_compile=xla)

    def train(x: Any, y: Any) -> Any:
        loss, grads = fwd_bwd(x, y)
        optimizer.apply_gradients(zip(grads, params, strict=True))
        return loss

    train_fn = tf.function(train)

    def timed(fn: Any) -> float:
        for _ in range(warmup):
            out = fn(x, y)
        _sync(out)
        start = time.perf_counter()
        for _ in range(steps):
            out = fn(x, y)
        _sync(out)
        return (time.perf_counter() - start) / steps

    t_train = timed(train_fn)
    t_fwd = timed(fwd)
    t_fwd_bwd = timed(lambda a, b: fwd_bwd(a, b)[0])
    if profile:
        tf.profiler.experimental.start(profile)
        for _ in range(3):
            out = train_fn(x, y)
        _sync(out)
        tf.profiler.experimental.stop()
    compat.set_precision_policy(keras, "float32")
    return {
        "dtype": dtype,
        "xla": xla,
        "batch": batch,
        "image_size": image,
        "steps": steps,
        "step_s": t_train,
        "images_per_s": batch / t_train,
        "breakdown_s": {
            "forward": t_fwd,
            "backward": max(t_fwd_bwd - t_fwd, 0.0),
            "optimizer": max(t_train - t_fwd_bwd, 0.0),
        },
        "profile_dir": profile,
    }


def _sync(out: Any) -> None:
    import tensorflow as tf

    tf.nest.map_structure(lambda t: t.numpy(), out)


def write_tfrecords(directory: Path, images: int, shards: int, size: tuple[int, int]) -> None:
    """Random JPEGs as ``train-0000K-of-0000N`` in the official ImageNet Example format."""
    import tensorflow as tf

    def feature(value: Any) -> Any:
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    height, width = size
    per_shard = max(images // shards, 1)
    rng = tf.random.Generator.from_seed(0)
    for shard in range(shards):
        path = directory / f"train-{shard:05d}-of-{shards:05d}"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for i in range(per_shard):
                pixels = tf.cast(rng.uniform([height, width, 3], 0, 255), tf.uint8)
                jpeg = tf.io.encode_jpeg(pixels, quality=90).numpy()
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "image/encoded": feature(jpeg),
                            "image/format": feature(b"JPEG"),
                            "image/class/label": feature(1 + (shard * per_shard + i) % 1000),
                            "image/height": feature(height),
                            "image/width": feature(width),
                            "image/channels": feature(3),
                            "image/colorspace": feature(b"RGB"),
                            "image/filename": feature(f"synthetic_{shard}_{i}.JPEG".encode()),
                        }
                    )
                )
                writer.write(example.SerializeToString())


def input_pipeline(*, images: int, shards: int, batch: int, batches: int, image: int) -> JSONDict:
    """images/s of models.data.imagenet.dataset on TFRecords written here (CPU decode)."""
    import os

    import tensorflow as tf

    from models.data import imagenet

    with tempfile.TemporaryDirectory() as tmp:
        write_tfrecords(Path(tmp), images, shards, (375, 500))
        ctx = tf.distribute.InputContext()
        ds = imagenet.dataset(ctx, batch, data_dir=tmp, training=True, seed=0, image_size=image)
        iterator = iter(ds)
        for _ in range(3):
            next(iterator)
        start = time.perf_counter()
        for _ in range(batches):
            images_batch, _ = next(iterator)
        images_batch.numpy()
        seconds = time.perf_counter() - start
    return {
        "records": images,
        "shards": shards,
        "batch": batch,
        "images_per_s": batch * batches / seconds,
        "cpu_cores": os.cpu_count(),
    }


def nccl_allreduce(sizes_mb: Sequence[int], iters: int) -> JSONDict:
    """Bus bandwidth of MirroredStrategy + NcclAllReduce across this node's GPUs."""
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) < 2:
        return {"skipped": f"{len(gpus)} GPU(s): the NCCL all-reduce needs 2 or more"}
    strategy = tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.NcclAllReduce())
    n = strategy.num_replicas_in_sync

    def replica_fn(v: Any) -> Any:
        v = tf.identity(v)
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, v)[0]

    rows = []
    for mb in sizes_mb:
        x = tf.ones([mb * (1 << 20) // 4])
        step = tf.function(lambda v: strategy.run(replica_fn, args=(v,)))
        _sync(strategy.experimental_local_results(step(x)))
        start = time.perf_counter()
        for _ in range(iters):
            out = step(x)
        _sync(strategy.experimental_local_results(out))
        seconds = (time.perf_counter() - start) / iters
        nbytes = mb * (1 << 20)
        rows.append(
            {
                "bytes": nbytes,
                "seconds": seconds,
                "busbw": harness.bus_bandwidth(nbytes, seconds, n),
            }
        )
    return {"gpus": n, "results": rows}


def model_cli(module: str, flags: Sequence[str], batch: int, steps: int, every: int) -> JSONDict:
    """examples/s of a bundled model's own training loop, from its progress lines."""
    argv = [
        harness.python(), "-m", module, *flags, "--use_synthetic_data",
        f"--batch_size={batch}", f"--train_steps={steps}", f"--log_every={every}",
        "--epochs_between_evals=100000", "--eval_steps=1",
    ]  # fmt: skip
    runs = harness.run_workers(
        [argv], [harness.clean_env()], [None], timeout=1200, done_marker='"event": "done"'
    )
    harness.check_runs(runs, module)
    rate, timed = harness.steady_rate(runs[0].stdout, batch)
    return {"module": module, "flags": list(flags), "batch": batch, "examples_per_s": rate,
            "steps_per_s": rate / batch, "steps_timed": timed}  # fmt: skip


def worker(quick: bool, smoke: bool, allow_cpu: bool, profile_root: str | None) -> int:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus and not allow_cpu:
        print("no GPU visible to TensorFlow. HINT: install the CUDA build: pip install "
              "-e '.[gpu,dev]'", file=sys.stderr)  # fmt: skip
        return 2
    details = [tf.config.experimental.get_device_details(g) for g in gpus]
    _emit("device", gpus=[d.get("device_name", "?") for d in details],
          tensorflow=tf.__version__, build=tf.sysconfig.get_build_info())  # fmt: skip
    batch, image = (2, 64) if smoke else (256, 224)
    steps, warmup = (2, 1) if smoke else ((20, 5) if quick else (100, 20))
    for dtype, xla in CONFIGS[:1] if quick or smoke else CONFIGS:
        profile = f"{profile_root}/resnet50-{dtype}" if profile_root else None
        _emit("resnet50", **resnet_compute(dtype, xla, batch=batch, steps=steps, warmup=warmup,
                                           image=image, profile=profile))  # fmt: skip
    cli_flags = ["--resnet_size=50", "--dtype=bf16", "--enable_xla"]
    if smoke:
        cli_flags.append("--image_size=64")
    cli = (batch, 6, 2) if smoke else ((batch, 60, 20) if quick else (batch, 220, 40))
    _emit("resnet50_cli", **model_cli("models.resnet", cli_flags, *cli))
    pipe = (16, 2, 4, 3) if smoke else ((512, 4, 256, 10) if quick else (2048, 16, 256, 40))
    _emit("input_pipeline", **input_pipeline(images=pipe[0], shards=pipe[1], batch=pipe[2],
                                             batches=pipe[3], image=image))  # fmt: skip
    mnist = (32, 6, 2) if smoke else ((512, 100, 25) if quick else (512, 600, 100))
    _emit("mnist", **model_cli("models.mnist", [], *mnist))
    _emit("nccl", **nccl_allreduce((1, 16) if smoke or quick else (1, 4, 16, 64, 256), 10))
    return 0


# ---------------------------------------------------------------------------- harness side
def run(options: Options) -> JSONDict:
    quick, log_dir = options.quick, options.log_dir
    names = gpu_names()
    if not names:
        return {
            "name": "gpu",
            "pending": True,
            "reason": "no GPU on this machine (nvidia-smi lists none). On an H100 or H200 run:",
            "command": COMMAND,
        }
    argv = [harness.python(), "-m", "benchmarks.bench_gpu", "--worker"]
    if quick:
        argv.append("--quick")
    if log_dir is not None:
        argv.append(f"--profile_dir={log_dir / 'profile'}")
    runs = harness.run_workers([argv], [harness.clean_env()], [None], timeout=3600,
                               log_dir=log_dir)  # fmt: skip
    harness.check_runs(runs, "GPU benchmark")
    result: JSONDict = {"name": "gpu", "nvidia_smi": names, "resnet50": []}
    for event in parse_events(runs[0].stdout):
        kind = event.pop("event")
        if kind == "resnet50":
            result["resnet50"].append(event)
        else:
            result[kind] = event
    return result


def markdown(result: JSONDict) -> str:
    rows = []
    for r in result.get("resnet50", []):
        b = r["breakdown_s"]
        total = max(r["step_s"], 1e-12)
        rows.append([
            f"{r['dtype']}{' + XLA' if r['xla'] else ''}", r["batch"], r["images_per_s"],
            r["images_per_s"] / A100_PUBLISHED_IMG_S, r["images_per_s"] / H100_TARGET_IMG_S,
            f"{b['forward'] / total:.0%} / {b['backward'] / total:.0%} / "
            f"{b['optimizer'] / total:.0%}",
        ])  # fmt: skip
    device = ", ".join(result.get("device", {}).get("gpus", [])) or "GPU"
    text = f"ResNet-50 v1.5, synthetic data on the device, one {device}:\n\n"
    text += harness.markdown_table(
        ["precision", "batch", "images/s", "x A100 published (2,375)", "x target (4,000)",
         "forward / backward / update"], rows)  # fmt: skip
    extra = []
    for key, label, field in (
        ("resnet50_cli", "ResNet-50 bf16 + XLA via `python -m models.resnet`", "examples_per_s"),
        ("input_pipeline", "TFRecord input pipeline (CPU decode + augment)", "images_per_s"),
        ("mnist", "MNIST via `python -m models.mnist`, steps/s", "steps_per_s"),
    ):
        if key in result:
            extra.append([label, result[key][field]])
    if extra:
        text += "\n" + harness.markdown_table(["measurement", "value"], extra)
    nccl = result.get("nccl", {})
    if nccl.get("skipped"):
        text += f"\nNCCL all-reduce: not measured, {nccl['skipped']}.\n"
    elif nccl.get("results"):
        text += "\n" + harness.markdown_table(
            ["NCCL size (MB)", "busbw (GB/s)"],
            [[r["bytes"] >> 20, r["busbw"] / 1e9] for r in nccl["results"]],
        )
    return text


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow_cpu", action="store_true", help="with --worker: run without GPU")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: check the code paths")
    parser.add_argument("--profile_dir", help="write TensorBoard profiles here")


def _worker(args: argparse.Namespace) -> int:
    return worker(args.quick, args.smoke, args.allow_cpu, args.profile_dir)


BENCHMARK = protocol.declare(__name__, Benchmark(
    "gpu", "GPU throughput", run, markdown,
    description=__doc__, arguments=_arguments, worker=_worker,
))  # fmt: skip
