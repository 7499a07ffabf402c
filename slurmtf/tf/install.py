"""Which TensorFlow this interpreter has, and one line when it will not do.

Read before TensorFlow is imported (the distribution's metadata), so that a release
outside the tested range (:mod:`slurmtf.tf.releases`) gets one line at start: an error
with the fix for an older one, a warning for a newer one, never a traceback. After the
import, a task given GPUs that TensorFlow cannot see gets a line naming which case it is:
the CPU wheel, or the GPU wheel without the CUDA libraries it was built for.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurmtf.errors import InputError, SlurmtfError
from slurmtf.tf import releases

log = logging.getLogger(__name__)
# Distributions that install the `tensorflow` package, the usual ones first.
DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel",
                 "tf-nightly", "tf-nightly-cpu", "intel-tensorflow")  # fmt: skip
GPU_WHEEL = "tensorflow[and-cuda]"
CPU_WHEEL = "tensorflow-cpu"


@dataclass(frozen=True)
class Installed:
    """The distribution that provides ``import tensorflow`` here."""

    distribution: str  # tensorflow-cpu
    version: str  # 2.17.1

    @property
    def cpu_only(self) -> bool:
        return self.distribution.endswith("-cpu")


def installed(
    version_of: Callable[[str], str] = importlib.metadata.version,
) -> Installed | None:
    """The installed TensorFlow distribution, or None when there is none."""
    for name in DISTRIBUTIONS:
        try:
            return Installed(name, version_of(name))
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def older_error(found: Installed) -> InputError:
    """The error for a release older than the tested range (exit 2: not retried)."""
    return InputError(
        "TensorFlow",
        f"{found.distribution} {found.version}",
        f"is older than the releases slurmtf is tested on ({releases.TESTED_RANGE})",
        f"load a newer module, or pip install '{GPU_WHEEL}>={releases.OLDEST.tensorflow}' "
        f"(CPU nodes: '{CPU_WHEEL}>={releases.OLDEST.tensorflow}'); docs/TENSORFLOW_VERSIONS.md",
    )


def newer_line(found: Installed) -> str:
    """The warning for a release newer than the tested range."""
    return (
        f"TensorFlow {found.version} ({found.distribution}) is newer than the releases "
        f"slurmtf is tested on ({releases.TESTED_RANGE}); going on. If multi-worker training "
        f"fails, try TensorFlow {releases.NEWEST.tensorflow} and say so with this version"
    )


def check_release(found: Installed | None = None) -> Installed | None:
    """At a rank's start, before ``import tensorflow``: raise ``InputError`` (exit 2, not
    retried) for a release older than the tested range; log one warning for a newer one.
    Returns what is installed (None: no TensorFlow; the import says so)."""
    found = installed() if found is None else found
    if found is None:
        return None
    where = releases.outside(found.version)
    if where == "older":
        raise older_error(found)
    if where == "newer":
        log.warning("%s", newer_line(found))
    return found


def not_importable(exc: ImportError, python: str = sys.executable) -> SlurmtfError:
    """The one line for a TensorFlow that cannot be imported: not installed, or installed
    but broken (its own error's last line, with the usual cause)."""
    found = installed()
    if found is None or importlib.util.find_spec("tensorflow") is None:
        return SlurmtfError(
            f'{python} has no TensorFlow. HINT: {python} -m pip install "slurmtf[gpu]" '
            '(GPU nodes) or "slurmtf[cpu]", or load your site\'s TensorFlow module'
        )
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
    return SlurmtfError(
        f"{found.distribution} {found.version} is installed in {python} but cannot be "
        f"imported ({type(exc).__name__}: {first}). HINT: its dependencies do not match it; "
        f"{python} -m pip install '{found.distribution}=={found.version}' reinstalls them "
        "(numpy below 2 up to TensorFlow 2.17)"
    )


def import_tensorflow() -> Any:
    """``import tensorflow`` and Keras after :func:`check_release`, without Keras's
    extras (:data:`slurmtf.tf.lean_import.KERAS_EXTRAS`: a bundled model's rank uses
    none); a failure is one line (:class:`SlurmtfError`), not a traceback."""
    from slurmtf.tf.lean_import import KERAS_EXTRAS, held_back

    check_release()
    try:
        with held_back(KERAS_EXTRAS):
            import tensorflow as tf

            importlib.import_module("keras")  # 2.15 imports it on first use: held here too
    except ImportError as exc:
        raise not_importable(exc) from exc
    return tf


@dataclass(frozen=True)
class Build:
    """What a TensorFlow build needs to see GPUs (``tf.sysconfig.get_build_info()``)."""

    cuda: bool
    cuda_version: str = ""  # 12.3
    cudnn_version: str = ""  # 8

    @classmethod
    def of(cls, info: Mapping[str, Any]) -> Build:
        return cls(
            bool(info.get("is_cuda_build")),
            str(info.get("cuda_version") or ""),
            str(info.get("cudnn_version") or ""),
        )

    def libraries(self) -> list[str]:
        """The shared libraries it loads for GPUs (the driver's and CUDA's)."""
        names = ["libcuda.so.1"]
        if self.cuda_version:
            names.append(f"libcudart.so.{self.cuda_version.split('.')[0]}")
        if self.cudnn_version:
            names.append(f"libcudnn.so.{self.cudnn_version.split('.')[0]}")
        return names


def loadable(name: str) -> bool:
    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True


def unseen_gpus_line(
    found: Installed | None,
    build: Build,
    given: Sequence[str],
    load: Callable[[str], bool] = loadable,
) -> str:
    """Why a task given GPUs (``given``: CUDA_VISIBLE_DEVICES) sees none in TensorFlow."""
    version = found.version if found else "?"
    gpus = ",".join(given)
    if not build.cuda or (found is not None and found.cpu_only):
        name = found.distribution if found else "this TensorFlow"
        return (
            f"{name} {version} is a CPU-only build: this task's GPUs "
            f"(CUDA_VISIBLE_DEVICES={gpus}) go unused and it trains on the CPU. HINT: "
            f"pip uninstall {name} && pip install '{GPU_WHEEL}=={version}'"
        )
    missing = [name for name in build.libraries() if not load(name)]
    built = f"CUDA {build.cuda_version or '?'}, cuDNN {build.cudnn_version or '?'}"
    cause = f"cannot load {', '.join(missing)}" if missing else "the GPUs did not initialise"
    return (
        f"TensorFlow {version} (built for {built}) sees none of this task's GPUs "
        f"(CUDA_VISIBLE_DEVICES={gpus}): {cause}; it trains on the CPU. HINT: pip install "
        f"'{GPU_WHEEL}=={version}' (NVIDIA's libraries as wheels), or load your site's CUDA "
        f"{build.cuda_version.split('.')[0] or ''} and cuDNN modules; nvidia-smi checks the driver"
    )


def check_gpus(tf: Any, given: Sequence[str] | None) -> str | None:
    """After the import: one warning when this task was given GPUs TensorFlow cannot see;
    returns the line (None when all is well)."""
    if not given or tf.config.list_physical_devices("GPU"):
        return None
    line = unseen_gpus_line(installed(), Build.of(tf.sysconfig.get_build_info()), given)
    log.warning("%s", line)
    return line
