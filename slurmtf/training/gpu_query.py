"""This node's GPUs as ``nvidia-smi`` reports them, asked at most once per timing window.

:func:`parse` reads ``nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total
--format=csv,noheader,nounits``; :func:`own` picks a rank's GPUs among its node's.
:class:`GpuProbe` never waits on the step's path: each window it collects the answer to
the previous window's query (a child that has not answered by then is killed) and starts
the next one. Without ``nvidia-smi`` on the ``PATH`` (looked up once) it does nothing.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

QUERY = [
    "nvidia-smi",
    "--query-gpu=index,utilization.gpu,memory.used,memory.total",
    "--format=csv,noheader,nounits",
]


@dataclass(frozen=True)
class GpuSample:
    """One GPU: utilisation in percent, memory in MiB."""

    index: int
    utilization: float
    memory_used_mib: float
    memory_total_mib: float


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def parse(text: str) -> list[GpuSample]:
    """One sample per well-formed line (``index, util, used, total``, or without the index:
    the line's position); a line with a field the GPU does not report is skipped."""
    out = []
    for position, line in enumerate(text.strip().splitlines()):
        values = [_number(f) for f in line.split(",")]
        numbers = [v for v in values if v is not None]
        if len(numbers) != len(values) or len(numbers) not in (3, 4):
            continue
        if len(numbers) == 3:
            numbers.insert(0, position)
        index, util, used, total = numbers
        out.append(GpuSample(int(index), util, used, total))
    return out


def own(samples: Sequence[GpuSample], visible: str | None) -> GpuSample | None:
    """This rank's GPUs among its node's ``samples``, as one: those whose index is in
    ``visible`` (``CUDA_VISIBLE_DEVICES``; every one when it is unset or names GPUs by
    UUID, as under ``ConstrainDevices`` a rank sees only its own), their mean utilisation
    and summed memory; None when none of them reported."""
    wanted = [w.strip() for w in (visible or "").split(",") if w.strip()]
    if wanted and all(w.isdigit() for w in wanted):
        samples = [s for s in samples if str(s.index) in wanted]
    if not samples:
        return None
    return GpuSample(
        min(s.index for s in samples),
        sum(s.utilization for s in samples) / len(samples),
        sum(s.memory_used_mib for s in samples),
        sum(s.memory_total_mib for s in samples),
    )


Popen = Callable[..., Any]


class GpuProbe:
    """The latest answer of ``nvidia-smi`` on this node (see the module doc)."""

    def __init__(self, popen: Popen = subprocess.Popen, which: Callable[..., Any] = shutil.which):
        self._popen = popen
        self.available = which(QUERY[0]) is not None
        self._child: Any = None

    def latest(self) -> list[GpuSample]:
        """The previous query's answer (none the first time), and the next query started."""
        found: list[GpuSample] = []
        if not self.available:
            return found
        child, self._child = self._child, None
        if child is not None:
            if child.poll() is None:
                child.kill()  # no answer in a whole window
                child.wait()
            elif child.returncode == 0:
                found = parse(child.stdout.read().decode(errors="replace"))
            child.stdout.close()
        try:
            self._child = self._popen(
                QUERY, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
            )
        except OSError:
            self.available = False
        return found

    def close(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            if child.poll() is None:
                child.kill()
            child.wait()
            child.stdout.close()
