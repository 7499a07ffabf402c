"""A user script that says where its rank runs and with what, then ends: no TensorFlow.

    python show_place.py        (through jobs/train.sbatch or submit --command)

It reads its cluster as a script from TensorFlow's multi-worker tutorial does
(``TF_CONFIG``) and prints one ``placement`` event, as the bundled models'
``--placement_only`` do: its rank, node, the GPUs slurmtf left it
(``CUDA_VISIBLE_DEVICES``), and the CPUs Slurm gave the job and the step
(``SLURM_JOB_CPUS_PER_NODE``, ``SLURM_CPUS_PER_TASK``). The allocation-shape tests run it
where the question is only the shape.
"""

from __future__ import annotations

import json
import os
import sys

from slurmtf import events


def main() -> int:
    cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    events.emit(
        "placement",
        rank=int(os.environ.get("SLURM_PROCID", "0")),
        num_workers=len(cluster.get("worker", [])),
        node=os.environ.get("SLURMD_NODENAME"),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        job_cpus_per_node=os.environ.get("SLURM_JOB_CPUS_PER_NODE"),
        cpus_per_task=os.environ.get("SLURM_CPUS_PER_TASK"),
        tensorflow="tensorflow" in sys.modules,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
