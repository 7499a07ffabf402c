"""The watcher's step: the supervisor's side of a job that outlives its batch host.

The batch host runs the batch script: the keeper (:mod:`slurmtf.runtime.batch_host.
keeper`) and the supervisor. Nothing on that node can act when the node itself is lost,
so the supervisor beats (:mod:`slurmtf.runtime.batch_host.heartbeat`) for a watcher on
another node of the job (:mod:`slurmtf.runtime.batch_host.watcher`), which requeues the
job without the node.

:class:`WatcherStep` is the watcher as a one-task ``srun --overlap`` step (no resources
of its own: it shares those of the job's other steps), named ``slurmtf-watcher``, on the
last node of the job that is not the batch host (the spare, when the job keeps one; in a
heterogeneous job, a node of another component when the batch host's is a single node).
It starts with the supervisor, starts again on another node when its node is left out or
it ends (at most :data:`WATCHER_STARTS` times), and ends with the supervisor. A one-node
job has no other node: there Slurm itself requeues the job when it declares the node
failed (``SlurmdTimeout``), ``--no-kill`` or not.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurmtf.cluster.hostlists import expand_hostlist
from slurmtf.runtime import job_log
from slurmtf.runtime.job.children import Child
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.runtime.job.step_nodes import allocated_nodes
from slurmtf.runtime.job_log import log
from slurmtf.runtime.slurm_calls import WATCHER_NAME, one_task_step

WATCHER_STARTS = 5  # in one allocation; then the job goes on unwatched, with a line
WATCHER_LOG = "watcher-{job}.out"


@dataclasses.dataclass(frozen=True)
class WatcherPlace:
    node: str
    group: int | None = None  # the heterogeneous job's component (srun --het-group)


def watcher_place(job: JobSettings, host: str, left_out: Sequence[str] = ()) -> WatcherPlace | None:
    """The last node of the job, in Slurm's order, that is neither the batch host nor
    left out (``None``: there is none, as in a one-node job)."""
    lists = job.slurm.het_nodelists if job.het_size > 1 else ()
    nodes: list[tuple[str, int | None]] = [(n, None) for n in allocated_nodes(job)]
    if lists:
        nodes = [(n, k) for k, text in enumerate(lists) if text for n in expand_hostlist(text)]
    usable = [(n, k) for n, k in nodes if n != host and n not in left_out]
    return WatcherPlace(*usable[-1]) if usable else None


def watcher_log(job: JobSettings) -> Path:
    return job.log_dir / WATCHER_LOG.format(job=job.job_id)


def watcher_args(
    job: JobSettings, place: WatcherPlace, host: str, job_log: Path | None
) -> list[str]:
    """srun's arguments for the watcher step, with the interpreter that runs the
    supervisor (outside any container prefix, as slurmtf's own steps)."""
    out = watcher_log(job)
    return [
        *one_task_step(place.node, place.group), f"--job-name={WATCHER_NAME}", "--input=none",
        f"--output={out}", f"--error={out}", "--open-mode=append",
        sys.executable, "-m", "slurmtf.cli", "watcher",
        f"--job_id={job.job_id}", f"--log_dir={job.log_dir}", f"--host={host}",
        f"--heartbeat_s={job.beat_s:g}", f"--max_restarts={job.budget}",
        f"--restart_budget={job.budget_mode}", f"--max_failures_per_hour={job.failures_per_hour}",
        f"--requeues={job.requeues}", f"--probe_s={job.probe_s:g}",
        *([f"--job_log={job_log}"] if job_log is not None else []),
        *(["--host_group=0"] if job.het_size > 1 else []),  # the batch host's component
    ]  # fmt: skip


class WatcherStep:
    """The watcher's step, kept running while the supervisor runs."""

    def __init__(self, job: JobSettings, env: Mapping[str, str]) -> None:
        self.job, self.env = job, dict(env)
        self.host = job.slurm.nodename or ""
        self.job_log = job_log.stdout_file()
        self.child: Child | None = None
        self.place: WatcherPlace | None = None
        self.starts = 0
        self.told = False

    @property
    def wanted(self) -> bool:
        return self.job.in_slurm and self.job.watcher and bool(self.host)

    def keep(self, left_out: Sequence[str] = ()) -> None:
        """Start the watcher, or start it again when it ended or its node is left out."""
        if not self.wanted:
            return
        running = self.child is not None and self.child.poll() is None
        if running and self.place is not None and self.place.node not in left_out:
            return
        if self.child is not None:
            self.child.stop(grace=0)
            self.child = None
        place = watcher_place(self.job, self.host, left_out)
        if place is None or self.starts >= WATCHER_STARTS:
            self._tell(place is None)
            return
        again = " again" if self.starts else ""
        log(f"watcher{again} on {place.node}: requeues the job if {self.host} (the batch "
            f"host) stops answering (heartbeat every {self.job.beat_s:g} s)")  # fmt: skip
        self.place = place
        self.child = Child(watcher_args(self.job, place, self.host, self.job_log), self.env,
                           stderr=watcher_log(self.job))  # fmt: skip
        self.starts += 1

    def stop(self, *, at_once: bool = False) -> None:
        """End the watcher's srun (``at_once``: SIGKILL, which signals no step)."""
        if self.child is not None:
            self.child.stop(grace=0 if at_once else 2)
            self.child = None

    def _tell(self, alone: bool) -> None:
        if self.told:
            return
        self.told = True
        if alone:
            log(f"no other node watches {self.host} (the batch host): if it is lost, Slurm "
                "requeues the job when it declares the node failed (SlurmdTimeout)")  # fmt: skip
        else:
            log(f"the watcher was started {WATCHER_STARTS} times: the job goes on unwatched")
