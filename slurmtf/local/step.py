"""One Slurm step on this machine: what ``srun`` would give each rank, and starting them.

``--cluster=local``, the benchmarks and the tests run N ranks as local processes through
the same resolver path as on a cluster. They all build the rank environment here
(:class:`LocalStep`), start from the same scrubbed environment (:func:`scrubbed_env`),
take ports from :func:`free_port_base` and start ranks with :func:`start_rank`.
"""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slurmtf.cluster.ports import port_free

# What a rank's environment never inherits from the caller's: the caller may itself run
# in a Slurm job, and its TF_CONFIG / GPU binding would leak into every rank.
SCRUBBED_PREFIXES = ("SLURM_", "SLURMD_", "SLURMTF_")
SCRUBBED_NAMES = ("TF_CONFIG", "CUDA_VISIBLE_DEVICES")
# Above Linux's ephemeral range (32768-60999) and the resolver's per-job window, so that
# a local step's ports never meet a sandbox job's or a client socket's.
PORT_RANGE = (61000, 65000)


def is_scrubbed(name: str) -> bool:
    """True for a variable :func:`scrubbed_env` removes."""
    return name.startswith(SCRUBBED_PREFIXES) or name in SCRUBBED_NAMES


def scrubbed_env(
    base: Mapping[str, str] | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``base`` (``os.environ``) without Slurm/slurmtf/TF_CONFIG/GPU variables, plus ``extra``."""
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if not is_scrubbed(k)}
    env.update(extra or {})
    return env


def node_names(nodes: int) -> tuple[str, ...]:
    """``localhost`` for one node, else distinct loopback addresses ``127.0.0.1..N``."""
    return ("localhost",) if nodes == 1 else tuple(f"127.0.0.{n}" for n in range(1, nodes + 1))


@dataclass(frozen=True)
class LocalStep:
    """A block-distributed ``srun`` step: ``tasks_per_node`` ranks on each of ``nodes``.

    ``num_tasks`` (default: all slots) may leave the last node short, as Slurm does;
    ``nodelist`` is the hostlist Slurm would print (default: the names joined by commas).
    ``port_base`` becomes ``SLURMTF_PORT_BASE``; ``extra`` is added to every rank
    (e.g. array ids, ``SLURM_JOB_NAME``).
    """

    nodes: tuple[str, ...] = ("localhost",)
    tasks_per_node: int = 1
    job_id: int | str = 4242
    num_tasks: int | None = None
    port_base: int | None = None
    restarts: int = 0
    nodelist: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """How many ranks the step has."""
        slots = len(self.nodes) * self.tasks_per_node
        return slots if self.num_tasks is None else self.num_tasks

    def task_counts(self) -> str:
        """``SLURM_STEP_TASKS_PER_NODE``: ``8(x3),5``-style counts."""
        per = self.tasks_per_node
        full, rest = divmod(self.size, per)
        counts = [f"{per}(x{full})" if full > 1 else str(per)] if full else []
        return ",".join(counts + ([str(rest)] if rest else []))

    def rank_env(self, rank: int) -> dict[str, str]:
        """The ``SLURM_*`` variables (job and step) of ``rank``."""
        if not 0 <= rank < self.size:
            raise ValueError(f"rank={rank!r} must be in [0, {self.size})")
        node = rank // self.tasks_per_node
        nodes_used = -(-self.size // self.tasks_per_node)
        nodelist = self.nodelist or ",".join(self.nodes[:nodes_used])
        tasks = self.task_counts()
        env = {
            "SLURM_JOB_ID": str(self.job_id),
            "SLURM_STEP_ID": "0",
            "SLURM_JOB_NODELIST": nodelist,
            "SLURM_NODELIST": nodelist,
            "SLURM_STEP_NODELIST": nodelist,
            "SLURM_JOB_NUM_NODES": str(nodes_used),
            "SLURM_NNODES": str(nodes_used),
            "SLURM_STEP_NUM_NODES": str(nodes_used),
            "SLURM_NTASKS": str(self.size),
            "SLURM_STEP_NUM_TASKS": str(self.size),
            "SLURM_TASKS_PER_NODE": tasks,
            "SLURM_STEP_TASKS_PER_NODE": tasks,
            "SLURM_DISTRIBUTION": "block",
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank % self.tasks_per_node),
            "SLURM_NODEID": str(node),
            "SLURMD_NODENAME": self.nodes[node],
            "SLURM_RESTART_COUNT": str(self.restarts),
        }
        if self.port_base is not None:
            env["SLURMTF_PORT_BASE"] = str(self.port_base)
        return env | dict(self.extra)


def free_port_base(count: int, low: int = PORT_RANGE[0], high: int = PORT_RANGE[1]) -> int:
    """A base port with ``count`` consecutive ports free right now, at a random place.

    Random, so that tests and benchmarks running at once on one machine rarely collide.
    """
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(low, high - count)
        if all(port_free(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports in [{low}, {high})")


def start_rank(
    argv: Sequence[str],
    env: Mapping[str, str],
    out: Path,
    err: Path,
    *,
    cwd: Path | None = None,
    append: bool = False,
    new_session: bool = True,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.Popen[bytes]:
    """Start one rank; in its own session by default (killed with its children by
    ``os.killpg``), else in the caller's (Ctrl-C in a terminal reaches it too)."""
    mode = "ab" if append else "wb"
    with out.open(mode) as out_file, err.open(mode) as err_file:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdout=out_file,
            stderr=err_file,
            stdin=subprocess.DEVNULL,
            start_new_session=new_session,
            preexec_fn=preexec_fn,  # noqa: PLW1509 - callers start ranks from one thread
        )
