"""GPU ids as Slurm writes them: ``SLURM_STEP_GPUS``, ``CUDA_VISIBLE_DEVICES``, counts.

Pure parsers used by :mod:`slurmtf.cluster.layout`; which GPUs each task then uses is
:mod:`slurmtf.cluster.gpu_plan`.
"""

from __future__ import annotations

import re

from slurmtf.errors import InputError

_GPU_ID = re.compile(r"[A-Za-z0-9:._/-]+")
_NO_GPUS = {"", "NoDevFiles", "none", "None"}
# More GPUs than any node has; a larger SLURM_GPUS_ON_NODE is garbage, not a list to build.
MAX_GPUS_PER_NODE = 1024
GPU_SPLIT_MODES = ("auto", "off", "force")


def parse_gpu_ids(text: str | None, name: str) -> tuple[str, ...] | None:
    """Slurm's GPU list (``0,1`` or UUIDs) as a tuple; ``None`` when unset."""
    if text is None:
        return None
    stripped = text.strip()
    if stripped in _NO_GPUS:
        return ()
    ids = tuple(item.strip() for item in stripped.split(","))
    for item in ids:
        if not _GPU_ID.fullmatch(item):
            raise InputError(
                name,
                text,
                f"has {item!r}, not a GPU index or UUID",
                "expect a comma list such as 0,1 (Slurm sets it; unset it if you set it by hand)",
            )
    return ids


def parse_visible_devices(text: str | None) -> tuple[str, ...] | None:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it: entries up to the first invalid one."""
    if text is None:
        return None
    visible: list[str] = []
    for item in text.split(","):
        entry = item.strip()
        if entry in _NO_GPUS or entry.startswith("-") or not _GPU_ID.fullmatch(entry):
            break
        visible.append(entry)
    return tuple(visible)


def parse_gpu_count(text: str | None, name: str = "SLURM_GPUS_ON_NODE") -> int | None:
    """``SLURM_GPUS_ON_NODE`` as a number; ``None`` when unset."""
    if text is None:
        return None
    value = text.strip()
    if not value.isascii() or not value.isdigit():
        raise InputError(name, text, "is not a count", "expect a number such as 2")
    if int(value) > MAX_GPUS_PER_NODE:
        raise InputError(
            name,
            text,
            f"is more than {MAX_GPUS_PER_NODE} GPUs on one node",
            "expect the GPU count Slurm set; unset it if you set it by hand",
        )
    return int(value)


def parse_split_mode(text: str | None, name: str = "SLURMTF_GPU_SPLIT") -> str:
    """``SLURMTF_GPU_SPLIT``: ``auto`` (default), ``off`` or ``force``."""
    mode = (text or "auto").strip().lower()
    if mode not in GPU_SPLIT_MODES:
        raise InputError(
            name, text, "is not a GPU split policy", f"use one of {', '.join(GPU_SPLIT_MODES)}"
        )
    return mode


def node_gpus(
    slurm_gpus: str | None,
    slurm_gpus_var: str,
    gpus_on_node: str | None,
    job_gpus: str | None = None,
) -> tuple[str, ...] | None:
    """The GPUs Slurm gave this step on this node; ``None`` when Slurm is silent.

    Under a per-task binding Slurm narrows ``SLURM_STEP_GPUS`` to the task's own GPUs
    but keeps ``SLURM_GPUS_ON_NODE`` the step's count on the node: a list shorter than
    that count is not the node's, so the job's list (``SLURM_JOB_GPUS``) is tried, and
    then ``0..count-1``.
    """
    ids = parse_gpu_ids(slurm_gpus, slurm_gpus_var)
    count = parse_gpu_count(gpus_on_node)
    if count is None:
        return ids
    if ids is not None and len(ids) == count:
        return ids
    job = parse_gpu_ids(job_gpus, "SLURM_JOB_GPUS")
    if job is not None and len(job) == count:
        return job
    return tuple(str(i) for i in range(count))
