"""Staging a data set to node-local scratch: time to stage, read rate shared vs local.

Run ``python -m benchmarks.bench_stage [--shared DIR] [--scratch DIR] [--mb 48]``. Writes an
MNIST-shaped data set (uncompressed IDX files and a MANIFEST.json) under ``--shared``,
stages it with :func:`slurmtf.datasets.stage.stage` to ``--scratch`` (copy + SHA-256 of
every file), then reads every file of both copies, cold (each file's pages dropped from
the page cache with ``posix_fadvise(DONTNEED)`` first) and warm: the result as JSON, then
its table.
Point ``--shared`` at a parallel file system and ``--scratch`` at a node's local disk to
see the ratio that matters; on one local disk the ratio is about 1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import harness, protocol
from benchmarks.harness import JSONDict
from benchmarks.protocol import Benchmark, Options
from slurmtf.datasets import manifest, stage

_CHUNK = 1 << 20


def write_dataset(root: Path, megabytes: int) -> int:
    """MNIST's four IDX files (uncompressed), ``megabytes`` of training images; bytes."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    n_train = max(1, megabytes * (1 << 20) // 784)
    for prefix, n in (("train", n_train), ("t10k", max(1, n_train // 6))):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=(n,), dtype=np.uint8)
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
                int(d).to_bytes(4, "big") for d in array.shape
            )
            manifest.atomic_write(root / f"{prefix}-{kind}-ubyte", header + array.tobytes())
    files = {p.name: manifest.sha256_file(p) for p in sorted(root.iterdir())}
    manifest.write(root, manifest.Manifest("bench", "random IDX files", "bench", "n/a", files))
    return sum((root / name).stat().st_size for name in files)


def read_all(root: Path, cold: bool) -> float:
    """Seconds to read every data file under ``root`` (cold: pages dropped first)."""
    paths = [p for p in sorted(root.iterdir()) if p.is_file() and not p.name.startswith(".")]
    if cold:
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    start = time.perf_counter()
    for path in paths:
        with path.open("rb") as handle:
            while handle.read(_CHUNK):
                pass
    return time.perf_counter() - start


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shared", type=Path, default=None, help="where the data set is written")
    parser.add_argument("--scratch", type=Path, default=None, help="node-local scratch")
    parser.add_argument("--mb", type=int, default=48, help="MB of training images (default 48)")
    parser.add_argument("--repeat", type=int, default=3, help="reads of each kind (median)")


def run(options: Options) -> JSONDict:
    shared, scratch = options.flag("shared", None), options.flag("scratch", None)
    megabytes, repeat = (
        (4, 1) if options.quick else (options.flag("mb", 48), options.flag("repeat", 3))
    )
    work = Path(tempfile.mkdtemp(prefix="bench-stage-"))
    try:
        src = (shared or work / "shared") / "mnist-bench"
        size = write_dataset(src, megabytes)
        env = {"STAGE_DIR": str(scratch or work / "scratch"), "SLURM_JOB_ID": "bench"}
        staged = stage.stage(src, env)
        reused = stage.stage(src, env)
        result: JSONDict = {
            "shared": str(src), "scratch": str(staged.path), "bytes": size,
            "stage_s": round(staged.seconds, 3),
            "stage_mb_s": round(size / (1 << 20) / max(staged.seconds, 1e-9), 1),
            "reuse_s": round(reused.seconds, 4),
        }  # fmt: skip
        for name, root in (("shared", src), ("local", staged.path)):
            for cold in (True, False):
                times = [read_all(root, cold) for _ in range(repeat)]
                rate = size / (1 << 20) / statistics.median(times)
                result[f"read_{name}_{'cold' if cold else 'warm'}_mb_s"] = round(rate, 1)
        ratio = result["read_local_cold_mb_s"] / result["read_shared_cold_mb_s"]
        result["cold_local_over_shared"] = round(ratio, 2)
        stage.unstage(env)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def markdown(result: JSONDict) -> str:
    row = [f"{result['shared']} -> {result['scratch']}", result["stage_s"], result["stage_mb_s"],
           result["reuse_s"], result["read_shared_cold_mb_s"], result["read_local_cold_mb_s"],
           result["cold_local_over_shared"]]  # fmt: skip
    headers = ["shared path -> scratch", "stage s", "stage MiB/s", "reuse s",
               "cold read shared MiB/s", "cold read local MiB/s", "local / shared"]  # fmt: skip
    return harness.markdown_table(headers, [row])


BENCHMARK = protocol.declare(__name__, Benchmark(
    "stage", "Staging data to node-local scratch", run, markdown,
    description=__doc__, arguments=_arguments,
))  # fmt: skip
