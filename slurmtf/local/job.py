"""``--cluster=local``: the same job as N local processes, through the same resolver path.

Each process runs ``python -m slurmtf.launch`` with the ``SLURM_*`` variables a real
``srun`` step would set, so :func:`slurmtf.resolver.resolve` builds TF_CONFIG exactly as
on a cluster. One node is ``localhost``; with ``--nodes=N`` the nodes are the loopback
addresses ``127.0.0.1..127.0.0.N`` (the resolver gives every rank its own port, so they
can share the machine). Sweeps run one grid point after the other; a run that exits 75
(preempted, checkpoint saved), or whose first failing rank was ended by a signal (a
kill, the OOM killer), is restarted with ``SLURM_RESTART_COUNT`` + 1, up to
``--max_requeues``, as the job scripts requeue a job; any other failure is not.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from slurmtf.contracts import EXIT_PREEMPTED, ending_signal, rank_log_paths
from slurmtf.local.step import LocalStep, node_names, start_rank
from slurmtf.monitor.status import summary
from slurmtf.runtime.launcher import LOCAL_ENV, job_id_of
from slurmtf.spec.jobspec import JobSpec


def job_ids(base: int, index: int, size: int) -> dict[str, str]:
    """Numeric Slurm-like ids: a job, or array task ``index`` of array ``base``."""
    if size == 1:
        return {"SLURM_JOB_ID": str(base)}
    return {
        "SLURM_JOB_ID": str(base + 1 + index),
        "SLURM_ARRAY_JOB_ID": str(base),
        "SLURM_ARRAY_TASK_ID": str(index),
    }


def rank_step(spec: JobSpec, ids: Mapping[str, str], restarts: int) -> LocalStep:
    """The ``srun`` step of one grid point: ``spec.nodes`` loopback nodes, block order."""
    names = node_names(spec.nodes)
    extra = {**ids, "SLURM_JOB_NAME": spec.job_name, LOCAL_ENV: "1"}  # + the array ids
    return LocalStep(
        names, spec.tasks_per_node, ids["SLURM_JOB_ID"], restarts=restarts, extra=extra
    )


@dataclasses.dataclass(frozen=True)
class Attempt:
    """How one run of a grid point ended: every rank's status, and the rank that failed
    first (``None`` when none did) with its status."""

    codes: tuple[int, ...]
    first_failed: tuple[int, int] | None = None

    @property
    def status(self) -> int:
        return max(self.codes) if any(self.codes) else 0

    def restart_reason(self) -> str | None:
        """Why a restart may help, as the job scripts decide it: every rank preempted
        (exit 75), or the first failing rank ended by a signal; else ``None``."""
        if all(c == EXIT_PREEMPTED for c in self.codes):
            return "preempted"
        if self.first_failed is not None:
            rank, status = self.first_failed
            ended_by = ending_signal(status)
            if ended_by is not None:
                return f"rank {rank} was killed by {ended_by.name}"
        return None


def run_point(
    spec: JobSpec,
    params: Mapping[str, str],
    ids: Mapping[str, str],
    *,
    spec_file: Path,
    environ: Mapping[str, str],
    restarts: int,
) -> Attempt:
    """Start every rank of one grid point, wait, stop the rest when one fails."""
    job_id = job_id_of(ids)
    outs = rank_log_paths(spec.folder, job_id, spec.num_tasks)
    errs = rank_log_paths(spec.folder, job_id, spec.num_tasks, "err")
    command = [sys.executable, "-u", "-m", "slurmtf.launch", f"--spec={spec_file}"]
    command.append(f"--params={json.dumps(dict(params))}")
    step = rank_step(spec, ids, restarts)
    procs = [
        start_rank(
            command,
            {**environ, **step.rank_env(rank)},
            outs[rank],
            errs[rank],
            append=True,
            new_session=False,
        )
        for rank in range(spec.num_tasks)
    ]
    codes: list[int | None] = [None] * len(procs)
    first: tuple[int, int] | None = None
    while any(c is None for c in codes):
        for rank, proc in enumerate(procs):
            if codes[rank] is None:
                codes[rank] = proc.poll()
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0, EXIT_PREEMPTED)]
        if failed:  # like srun --kill-on-bad-exit, which names the first task that failed
            first = first or (failed[0][0], int(failed[0][1] or 0))
            for rank, proc in enumerate(procs):
                if codes[rank] is None:
                    proc.kill()
                    codes[rank] = proc.wait()
        time.sleep(0.2)
    return Attempt(tuple(c if c is not None else 1 for c in codes), first)


def run_local(spec: JobSpec, out: TextIO, environ: Mapping[str, str] | None = None) -> int:
    """Run every grid point as local processes; print logs and summaries; worst status."""
    env = dict(os.environ if environ is None else environ)
    spec.folder.mkdir(parents=True, exist_ok=True)
    base = os.getpid()
    spec_file = spec.folder / f"{base}_local_spec.json"
    spec_file.write_text(json.dumps(spec.to_json()))
    grid = spec.grid
    worst = 0
    for index, params in enumerate(grid):
        ids = job_ids(base, index, len(grid))
        job_id = job_id_of(ids)
        label = f" {params}" if params else ""
        print(f"slurmtf: local job {job_id}{label}: {spec.num_tasks} process(es); logs:", file=out)
        for rank, path in enumerate(rank_log_paths(spec.folder, job_id, spec.num_tasks)):
            print(f"  rank {rank}: {path}", file=out)
        out.flush()
        for restarts in range(spec.max_requeues + 1):
            attempt = run_point(
                spec, params, ids, spec_file=spec_file, environ=env, restarts=restarts
            )
            why = attempt.restart_reason()
            if why is None or restarts == spec.max_requeues:
                break
            print(f"slurmtf: {job_id} {why}; restart {restarts + 1}", file=out, flush=True)
        status = attempt.status
        worst = max(worst, status)
        print(summary(job_id, spec.folder, spec.num_tasks, status), file=out, flush=True)
    return worst
