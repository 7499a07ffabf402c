"""``--cluster=local``: the same job as N local processes, through the same resolver path.

Each process runs ``python -m slurmtf.launch`` with the ``SLURM_*`` variables a real
``srun`` step would set, so :func:`slurmtf.resolver.resolve` builds TF_CONFIG exactly as
on a cluster. One node is ``localhost``; with ``--nodes=N`` the nodes are the loopback
addresses ``127.0.0.1..127.0.0.N`` (the resolver gives every rank its own port, so they
can share the machine). Sweeps run one grid point after the other; a run that exits 75
(preempted, checkpoint saved) is restarted with ``SLURM_RESTART_COUNT`` + 1, up to
``--max_requeues``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from slurmtf.contracts import EXIT_PREEMPTED, rank_log_paths
from slurmtf.jobspec import JobSpec
from slurmtf.launch import LOCAL_ENV, job_id_of
from slurmtf.watch import summary


def node_names(nodes: int) -> list[str]:
    """``localhost`` for one node, else distinct loopback addresses."""
    return ["localhost"] if nodes == 1 else [f"127.0.0.{n}" for n in range(1, nodes + 1)]


def job_ids(base: int, index: int, size: int) -> dict[str, str]:
    """Numeric Slurm-like ids: a job, or array task ``index`` of array ``base``."""
    if size == 1:
        return {"SLURM_JOB_ID": str(base)}
    return {
        "SLURM_JOB_ID": str(base + 1 + index),
        "SLURM_ARRAY_JOB_ID": str(base),
        "SLURM_ARRAY_TASK_ID": str(index),
    }


def fake_slurm_env(
    spec: JobSpec, ids: Mapping[str, str], rank: int, restarts: int
) -> dict[str, str]:
    """The ``SLURM_*`` variables of rank ``rank`` in a block-distributed ``srun`` step."""
    names = node_names(spec.nodes)
    per_node = spec.tasks_per_node
    nodelist = ",".join(names)
    tasks = f"{per_node}(x{spec.nodes})" if spec.nodes > 1 else str(per_node)
    return {
        **ids,
        "SLURM_JOB_NAME": spec.job_name,
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NODELIST": nodelist,
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": str(spec.nodes),
        "SLURM_NNODES": str(spec.nodes),
        "SLURM_STEP_NUM_NODES": str(spec.nodes),
        "SLURM_NTASKS": str(spec.num_tasks),
        "SLURM_STEP_NUM_TASKS": str(spec.num_tasks),
        "SLURM_TASKS_PER_NODE": tasks,
        "SLURM_STEP_TASKS_PER_NODE": tasks,
        "SLURM_DISTRIBUTION": "block",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank % per_node),
        "SLURM_NODEID": str(rank // per_node),
        "SLURMD_NODENAME": names[rank // per_node],
        "SLURM_RESTART_COUNT": str(restarts),
        LOCAL_ENV: "1",
    }


def run_point(
    spec: JobSpec,
    params: Mapping[str, str],
    ids: Mapping[str, str],
    *,
    spec_file: Path,
    environ: Mapping[str, str],
    restarts: int,
) -> list[int]:
    """Start every rank of one grid point, wait, stop the rest when one fails."""
    job_id = job_id_of(ids)
    outs = rank_log_paths(spec.folder, job_id, spec.num_tasks)
    errs = rank_log_paths(spec.folder, job_id, spec.num_tasks, "err")
    procs: list[subprocess.Popen[bytes]] = []
    command = [sys.executable, "-u", "-m", "slurmtf.launch", f"--spec={spec_file}"]
    command.append(f"--params={json.dumps(dict(params))}")
    for rank in range(spec.num_tasks):
        env = {**environ, **fake_slurm_env(spec, ids, rank, restarts)}
        with outs[rank].open("ab") as out, errs[rank].open("ab") as err:
            procs.append(subprocess.Popen(command, env=env, stdout=out, stderr=err))
    codes: list[int | None] = [None] * len(procs)
    while any(c is None for c in codes):
        for rank, proc in enumerate(procs):
            if codes[rank] is None:
                codes[rank] = proc.poll()
        failed = [c for c in codes if c not in (None, 0, EXIT_PREEMPTED)]
        if failed:  # like srun --kill-on-bad-exit
            for rank, proc in enumerate(procs):
                if codes[rank] is None:
                    proc.kill()
                    codes[rank] = proc.wait()
        time.sleep(0.2)
    return [c if c is not None else 1 for c in codes]


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
            codes = run_point(
                spec, params, ids, spec_file=spec_file, environ=env, restarts=restarts
            )
            if not all(c == EXIT_PREEMPTED for c in codes) or restarts == spec.max_requeues:
                break
            print(f"slurmtf: {job_id} preempted; restart {restarts + 1}", file=out)
        status = max(codes) if any(codes) else 0
        worst = max(worst, status)
        print(summary(job_id, spec.folder, spec.num_tasks, status), file=out, flush=True)
    return worst
