"""An analytic model of data-parallel scaling efficiency for 8 to 512 GPUs.

The model (all assumptions are parameters, defaults stated below):

* Each step every GPU computes forward + backward on its own batch in ``step_time``
  seconds (measured on one GPU, or a published figure), then the gradients
  (``grad_bytes``) are summed across all N GPUs with an all-reduce.
* All-reduce time, ring algorithm over N GPUs (nccl-tests' bus-bandwidth model)::

      t_ar = 2(N-1)/N * grad_bytes / busbw  +  2(N-1) * alpha          (ring)
      t_ar = 2(N-1)/N * grad_bytes / busbw  +  2 log2(N) * alpha       (tree)

  ``busbw`` is the NVLink bus bandwidth inside one node, and across nodes the smaller of
  that and the node's aggregate NIC line rate times an efficiency (NCCL runs one ring
  per NIC, so a node's inter-node traffic is 2(N-1)/N * grad_bytes over all its NICs
  together). ``alpha`` is the per-hop latency (NVLink inside a node, network across).
* Overlap: a fraction ``overlap`` of the all-reduce can run during the backward pass
  (``backward_fraction`` of the step), never longer than that pass. TensorFlow's
  MultiWorkerMirroredStrategy all-reduces the gradients after ``tape.gradient``
  returns, so its case is no overlap (0.0); a bucketed, overlapped all-reduce (Horovod,
  PyTorch DDP) is modelled with 0.8 (the last buckets are always exposed).
* Exposed communication = t_ar - min(overlap * t_ar, backward_fraction * step_time);
  efficiency(N) = step_time / (step_time + exposed); images/s = N * batch / that.
* Not modelled: stragglers, input-pipeline stalls, gradient compression, SHARP /
  NVLink SHARP in-network reduction, congestion from other jobs. Weak scaling: the
  per-GPU batch stays fixed.

    python -m benchmarks.projection            # print the tables
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks import harness
from benchmarks.harness import JSONDict

GB = 1e9
GPU_COUNTS = (8, 16, 32, 64, 128, 256, 512)

# ResNet-50 v1.5 (models.resnet, 1001 classes): 25,559,081 trainable parameters. Keras
# mixed precision keeps fp32 variables, so the all-reduced gradients are fp32.
RESNET50_PARAMS = 25_559_081
RESNET50_GRAD_BYTES = RESNET50_PARAMS * 4  # ~102 MB
NVIDIA_A100_AMP_XLA_IMG_S = 2375.0  # NVIDIA's published TF ResNet-50 figure, one A100
H100_TARGET_IMG_S = 4000.0


@dataclass(frozen=True)
class Interconnect:
    """A node type: GPUs per node, bus bandwidth inside it, NICs out of it."""

    name: str
    gpus_per_node: int
    intra_busbw: float  # bytes/s an all-reduce achieves inside one node (NVLink/PCIe)
    nic_line_rate: float  # bytes/s per direction, all NICs of a node together
    nic_efficiency: float = 0.9  # fraction of line rate NCCL reaches across nodes
    intra_alpha: float = 1e-6  # s per ring hop inside a node
    inter_alpha: float = 5e-6  # s per ring hop across nodes

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1 or self.intra_busbw <= 0 or self.nic_line_rate <= 0:
            raise ValueError(f"{self!r}: GPUs per node and bandwidths must be positive")
        if not 0 < self.nic_efficiency <= 1:
            raise ValueError(f"nic_efficiency={self.nic_efficiency!r} must be in (0, 1]")

    def busbw(self, n_gpus: int) -> float:
        """Bus bandwidth of an all-reduce over ``n_gpus`` GPUs (bytes/s)."""
        if n_gpus <= self.gpus_per_node:
            return self.intra_busbw
        return min(self.intra_busbw, self.nic_line_rate * self.nic_efficiency)

    def alpha(self, n_gpus: int) -> float:
        return self.intra_alpha if n_gpus <= self.gpus_per_node else self.inter_alpha


def gbit(per_nic: float, nics: int) -> float:
    """Bytes/s of ``nics`` links of ``per_nic`` Gb/s each."""
    return per_nic * nics * 1e9 / 8


INTERCONNECTS = (
    Interconnect("8x H100 NVLink, 4x200 Gb/s IB", 8, 360 * GB, gbit(200, 4)),
    Interconnect("8x H100 NVLink, 8x400 Gb/s IB (DGX H100)", 8, 360 * GB, gbit(400, 8)),
    Interconnect("8x GPU NVLink, 1x100 GbE RoCE", 8, 360 * GB, gbit(100, 1)),
    Interconnect("8x GPU PCIe (no NVLink), 1x25 GbE", 8, 20 * GB, gbit(25, 1), inter_alpha=20e-6),
)


@dataclass(frozen=True)
class Workload:
    name: str
    step_time: float  # s per step on one GPU, forward + backward + update
    grad_bytes: float
    batch_per_gpu: int
    backward_fraction: float = 2 / 3

    def __post_init__(self) -> None:
        if self.step_time <= 0 or self.grad_bytes < 0 or self.batch_per_gpu < 1:
            raise ValueError(f"{self!r}: step time, gradient bytes and batch must be positive")

    @classmethod
    def from_throughput(
        cls, name: str, images_per_s: float, grad_bytes: float, batch_per_gpu: int = 256
    ) -> Workload:
        return cls(name, batch_per_gpu / images_per_s, grad_bytes, batch_per_gpu)


def allreduce_time(n_gpus: int, nbytes: float, net: Interconnect, algorithm: str = "ring") -> float:
    """Seconds for one all-reduce of ``nbytes`` over ``n_gpus`` GPUs."""
    if n_gpus < 1:
        raise ValueError(f"n_gpus={n_gpus!r} must be at least 1")
    if n_gpus == 1:
        return 0.0
    bandwidth = harness.ring_factor(n_gpus) * nbytes / net.busbw(n_gpus)
    if algorithm == "ring":
        hops = 2 * (n_gpus - 1)
    elif algorithm == "tree":
        hops = 2 * math.ceil(math.log2(n_gpus))
    else:
        raise ValueError(f"algorithm={algorithm!r}: use 'ring' or 'tree'")
    return bandwidth + hops * net.alpha(n_gpus)


def project(
    work: Workload, net: Interconnect, n_gpus: int, overlap: float = 0.0, algorithm: str = "ring"
) -> JSONDict:
    """Efficiency and throughput of ``work`` on ``n_gpus`` GPUs of ``net``."""
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap={overlap!r} must be in [0, 1]")
    t_ar = allreduce_time(n_gpus, work.grad_bytes, net, algorithm)
    hidden = min(overlap * t_ar, work.backward_fraction * work.step_time)
    exposed = t_ar - hidden
    step = work.step_time + exposed
    return {
        "gpus": n_gpus,
        "allreduce_s": t_ar,
        "exposed_s": exposed,
        "step_s": step,
        "efficiency": work.step_time / step,
        "images_per_s": n_gpus * work.batch_per_gpu / step,
    }


def default_workloads(measured_img_s: float | None = None) -> list[Workload]:
    works = [
        Workload.from_throughput(
            "ResNet-50, A100 published (2,375 img/s)",
            NVIDIA_A100_AMP_XLA_IMG_S,
            RESNET50_GRAD_BYTES,
        ),
        Workload.from_throughput(
            "ResNet-50, H100 target (4,000 img/s)", H100_TARGET_IMG_S, RESNET50_GRAD_BYTES
        ),
    ]
    if measured_img_s:
        works.append(
            Workload.from_throughput(
                f"ResNet-50, measured ({measured_img_s:,.0f} img/s)",
                measured_img_s,
                RESNET50_GRAD_BYTES,
            )
        )
    return works


def run(quick: bool = False, measured_img_s: float | None = None) -> JSONDict:
    """Every workload x interconnect x GPU count, with and without overlap, ring and tree."""
    del quick  # pure arithmetic: always complete
    rows = []
    for work in default_workloads(measured_img_s):
        for net in INTERCONNECTS:
            for overlap in (0.0, 0.8):
                for algorithm in ("ring", "tree"):
                    for n in GPU_COUNTS:
                        rows.append(
                            {
                                "workload": work.name,
                                "interconnect": net.name,
                                "overlap": overlap,
                                "algorithm": algorithm,
                                "step_time_1gpu_s": work.step_time,
                                **project(work, net, n, overlap, algorithm),
                            }
                        )
    return {
        "name": "projection",
        "assumptions": {
            "grad_bytes": RESNET50_GRAD_BYTES,
            "batch_per_gpu": 256,
            "backward_fraction": 2 / 3,
            "interconnects": [vars(net) for net in INTERCONNECTS],
            "measured_img_s": measured_img_s,
        },
        "rows": rows,
    }


def select(result: JSONDict, workload: str, overlap: float, algorithm: str) -> list[JSONDict]:
    return [
        r
        for r in result["rows"]
        if r["workload"] == workload and r["overlap"] == overlap and r["algorithm"] == algorithm
    ]


def markdown(result: JSONDict) -> str:
    """Efficiency per interconnect (rows) and GPU count (columns), one table per case."""
    parts = []
    workloads = list(dict.fromkeys(r["workload"] for r in result["rows"]))
    for work in workloads:
        for overlap, algorithm in ((0.0, "ring"), (0.0, "tree"), (0.8, "ring")):
            chosen = select(result, work, overlap, algorithm)
            nets = list(dict.fromkeys(r["interconnect"] for r in chosen))
            table = []
            for net in nets:
                mine = {r["gpus"]: r for r in chosen if r["interconnect"] == net}
                table.append([net, *[f"{mine[n]['efficiency']:.3f}" for n in GPU_COUNTS]])
            parts.append(
                f"**{work}**, {algorithm} all-reduce, overlap {overlap:g}: scaling efficiency\n\n"
            )
            parts.append(harness.markdown_table(["interconnect", *map(str, GPU_COUNTS)], table))
            parts.append("\n")
    return "".join(parts)


def plot(result: JSONDict, out_dir: Any) -> list[Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    work = next(r["workload"] for r in result["rows"] if "H100 target" in r["workload"])
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for overlap, algorithm, style in ((0.0, "ring", "-"), (0.8, "ring", ":")):
        chosen = select(result, work, overlap, algorithm)
        nets = list(dict.fromkeys(r["interconnect"] for r in chosen))
        for i, net in enumerate(nets):
            mine = [r for r in chosen if r["interconnect"] == net]
            ax.plot(
                [r["gpus"] for r in mine],
                [r["efficiency"] for r in mine],
                style,
                marker="o",
                color=f"C{i}",
                label=f"{net}" + (", overlap 0.8" if overlap else ""),
            )
    ax.set_xscale("log", base=2)
    ax.set_xticks(GPU_COUNTS, [str(n) for n in GPU_COUNTS])
    ax.set_xlabel("GPUs")
    ax.set_ylabel("scaling efficiency")
    ax.set_title("Projected ResNet-50 efficiency (4,000 img/s per GPU, ring)")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, loc="lower left")
    fig.tight_layout()
    path = out_dir / "projection.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def main(argv: Sequence[str] | None = None) -> int:
    del argv
    print(markdown(run()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
