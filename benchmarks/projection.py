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
* Compression: gradients all-reduced in a smaller dtype (``--allreduce_dtype=bf16``)
  shrink the bandwidth term by ``compression``. Its value, and the overlap TensorFlow's
  all-reduce really reaches, are taken from this machine's measurements when their
  results are in the output folder (``links.json``: all-reduce time fp32 / bf16 at the
  slowest link; ``breakdown.json``: the part of the all-reduce a training step hid), else
  2.0 (the byte ratio) and 0.0.
* Not modelled: stragglers, input-pipeline stalls, SHARP / NVLink SHARP in-network
  reduction, congestion from other jobs. Weak scaling: the per-GPU batch stays fixed.

    python -m benchmarks.projection [--out DIR]   # the tables; measured inputs from DIR
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

from benchmarks import harness, protocol
from benchmarks.harness import JSONDict
from benchmarks.protocol import Benchmark, Options, figure

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
    work: Workload,
    net: Interconnect,
    n_gpus: int,
    *,
    overlap: float = 0.0,
    algorithm: str = "ring",
    compression: float = 1.0,
) -> JSONDict:
    """Efficiency and throughput of ``work`` on ``n_gpus`` GPUs of ``net``."""
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap={overlap!r} must be in [0, 1]")
    if compression < 1:
        raise ValueError(f"compression={compression!r} must be at least 1 (1 = none)")
    t_ar = allreduce_time(n_gpus, work.grad_bytes / compression, net, algorithm)
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


@dataclass(frozen=True)
class Case:
    """One way of reducing gradients: how much of the all-reduce is hidden, how compressed."""

    label: str
    overlap: float
    algorithm: str
    compression: float = 1.0


def cases(overlap: float, compression: float) -> list[Case]:
    """TensorFlow as measured here (fp32, then bf16 on the wire), tree, and a bucketed
    all-reduce that overlaps the backward pass (Horovod, PyTorch DDP)."""
    return [
        Case(f"fp32, overlap {overlap:.2f} (measured)", overlap, "ring"),
        Case(f"fp32, overlap {overlap:.2f} (measured), tree", overlap, "tree"),
        Case(f"bf16 on the wire ({compression:.2f}x measured)", overlap, "ring", compression),
        Case("fp32, overlap 0.8 (bucketed, Horovod / DDP)", 0.8, "ring"),
    ]


def measured_compression(links: JSONDict | None) -> float:
    """fp32 / bf16 all-reduce time of the largest tensor at the slowest shaped link."""
    if not links:
        return 2.0
    from slurmtf.sandbox.links import parse_rate

    shaped = [r for r in links["rates"] if parse_rate(r["rate"])]
    if not shaped:
        return 2.0
    slowest = min(shaped, key=lambda r: parse_rate(r["rate"]))
    size = max(row["bytes"] for row in slowest["results"])
    time = {r["dtype"]: float(r["seconds"]) for r in slowest["results"] if r["bytes"] == size}
    if "fp32" not in time or "bf16" not in time:
        return 2.0
    return max(1.0, time["fp32"] / time["bf16"])


def measured_overlap(breakdown: JSONDict | None) -> float:
    """The part of the fp32 all-reduce a 2-worker training step hid, at the slowest link.

    hidden = compute + all-reduce alone - step, as a fraction of the all-reduce alone.
    """
    if not breakdown:
        return 0.0
    fractions = []
    for entry in breakdown["models"]:
        link = entry["links"][-1]
        for run_ in link["runs"]:
            if "error" in run_:
                continue
            by = {(r["phase"], r["setting"]): r["seconds"] for r in run_["rows"]}
            reduce = next(v for (ph, st), v in by.items() if ph == "all-reduce" and "Keras" in st)
            step = next(v for (ph, st), v in by.items() if ph == "step" and "Keras" in st)
            hidden = by["compute", ""] + reduce - step
            fractions.append(min(1.0, max(0.0, hidden / reduce)))
    return harness.median(fractions) if fractions else 0.0


def _earlier(out_dir: Path | None, name: str) -> JSONDict | None:
    path = None if out_dir is None else out_dir / f"{name}.json"
    if path is None or not path.exists():
        return None
    data: JSONDict = json.loads(path.read_text())
    return None if data.get("pending") or data.get("error") else data


def measured_gpu_img_s(gpu: JSONDict | None) -> float | None:
    """Best measured ResNet-50 images/s on one GPU, from ``gpu.json`` when it holds one."""
    rates = [r["images_per_s"] for r in (gpu or {}).get("resnet50", []) if r.get("images_per_s")]
    return float(max(rates)) if rates else None


def run(options: Options) -> JSONDict:
    """Every workload x interconnect x case x GPU count; measured inputs from ``out_dir``."""
    out_dir = options.out_dir
    img_s = options.flag("measured_img_s", None) or measured_gpu_img_s(_earlier(out_dir, "gpu"))
    overlap = measured_overlap(_earlier(out_dir, "breakdown"))
    compression = measured_compression(_earlier(out_dir, "links"))
    rows = []
    for work in default_workloads(img_s):
        for net in INTERCONNECTS:
            for case in cases(overlap, compression):
                for n in GPU_COUNTS:
                    got = project(work, net, n, overlap=case.overlap, algorithm=case.algorithm,
                                  compression=case.compression)  # fmt: skip
                    rows.append({"workload": work.name, "interconnect": net.name,
                                 "case": case.label, "step_time_1gpu_s": work.step_time,
                                 **got})  # fmt: skip
    return {
        "name": "projection",
        "assumptions": {
            "grad_bytes": RESNET50_GRAD_BYTES,
            "batch_per_gpu": 256,
            "backward_fraction": 2 / 3,
            "interconnects": [vars(net) for net in INTERCONNECTS],
            "measured_img_s": img_s,
            "measured_overlap": overlap,
            "measured_compression": compression,
        },
        "rows": rows,
    }


def select(result: JSONDict, workload: str, case: str) -> list[JSONDict]:
    return [r for r in result["rows"] if r["workload"] == workload and r["case"] == case]


def markdown(result: JSONDict) -> str:
    """Efficiency per interconnect (rows) and GPU count (columns), one table per case."""
    parts = []
    for work in dict.fromkeys(r["workload"] for r in result["rows"]):
        for case in dict.fromkeys(r["case"] for r in result["rows"]):
            chosen = select(result, work, case)
            table = []
            for net in dict.fromkeys(r["interconnect"] for r in chosen):
                mine = {r["gpus"]: r for r in chosen if r["interconnect"] == net}
                table.append([net, *[f"{mine[n]['efficiency']:.3f}" for n in GPU_COUNTS]])
            parts.append(f"**{work}**, {case}: scaling efficiency\n\n")
            parts.append(harness.markdown_table(["interconnect", *map(str, GPU_COUNTS)], table))
            parts.append("\n")
    return "".join(parts)


def plot(result: JSONDict, out_dir: Path) -> list[Path]:
    work = next(r["workload"] for r in result["rows"] if "H100 target" in r["workload"])
    labels = list(dict.fromkeys(r["case"] for r in result["rows"]))
    shown = ((labels[0], "-"), (labels[2], "--"), (labels[3], ":"))
    path = out_dir / "projection.png"
    with figure(path) as ax:
        for case, style in shown:
            chosen = select(result, work, case)
            for i, net in enumerate(dict.fromkeys(r["interconnect"] for r in chosen)):
                mine = [r for r in chosen if r["interconnect"] == net]
                ax.plot([r["gpus"] for r in mine], [r["efficiency"] for r in mine], style,
                        marker="o", color=f"C{i}", label=f"{net}; {case}")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xticks(GPU_COUNTS, [str(n) for n in GPU_COUNTS])
        ax.set_xlabel("GPUs")
        ax.set_ylabel("scaling efficiency")
        ax.set_title("Projected ResNet-50 efficiency (4,000 img/s per GPU, ring)")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=5, loc="lower left")
    return [path]


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--measured_img_s", type=float, help="one GPU's ResNet-50 images/s")


BENCHMARK = protocol.declare(__name__, Benchmark(
    "projection", "Projection to 8-512 GPUs (model, not a measurement)", run, markdown, plot,
    description=__doc__, arguments=_arguments,
))  # fmt: skip
