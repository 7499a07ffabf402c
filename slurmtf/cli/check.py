"""``slurmtf check``: which node or link slows an allocation (docs/CHECK.md).

Inside an allocation (``salloc``, a job script) it runs one ``srun`` step, one task per
node, of :mod:`slurmtf.check.probe` and prints the verdict; from a login node
``--nodes=N`` submits a short job that does the same and waits for its verdict.
Exit status: 0 healthy, 1 an outlier (or the check itself failed), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurmtf.check import verdict
from slurmtf.cli import ArgumentParser, add_flag, run_command
from slurmtf.cluster.env import read_slurm_env
from slurmtf.cluster.hostlists import expand_hostlist
from slurmtf.cluster.ports import parse_resv_mode
from slurmtf.cluster.step_flags import whole_node_environ
from slurmtf.contracts import is_final
from slurmtf.errors import InputError, SlurmCommandError, SlurmtfError
from slurmtf.events import last, parse_events
from slurmtf.monitor.status import job_states
from slurmtf.slurm.controller import ControllerSilent, patient
from slurmtf.slurm.resv_ports import cluster_span, resv_ports_args
from slurmtf.slurm.runner import Runner, default_runner

PROBE_FLAGS = ("threshold", "link_seconds", "link_rounds", "allreduce_mb")
STEP_TIMEOUT_S = 300.0


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="slurmtf check", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="from a login node: submit a check job on N nodes and wait for it",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the verdict here (JSON)")
    p.add_argument(
        "--threshold",
        type=float,
        default=verdict.DEFAULT_THRESHOLD,
        help="a node is an outlier when a figure is this many times below the "
        f"median of the nodes (default {verdict.DEFAULT_THRESHOLD:g})",
    )
    add_flag(
        p,
        "link_seconds",
        type=float,
        default=None,
        help="seconds per link round (default 0.5; on more than 10 nodes the rounds share "
        "5 s, at least 0.25 s each)",
    )
    add_flag(
        p,
        "link_rounds",
        type=int,
        default=15,
        help="rounds of node-to-node streams, each to the next node but k (default 15)",
    )
    add_flag(p, "allreduce_mb", type=float, default=4.0, help="all-reduce size (MiB)")
    p.add_argument("--partition", default=None, help="with --nodes: the partition")
    add_flag(
        p,
        "out_dir",
        type=Path,
        default=Path("slurmtf-check"),
        help="with --nodes: where the job's output and JSON go (default ./slurmtf-check)",
    )
    return p


def main(argv: Sequence[str] | None = None, runner: Runner = default_runner) -> int:
    # every command of a check needs the controller: a brief retry, then what was asked
    return run_command("slurmtf check", _parser(), argv, lambda a: _run(a, patient(runner)))


def _run(args: argparse.Namespace, runner: Runner) -> int:
    verdict.check_threshold(args.threshold)
    if (args.link_seconds is not None and args.link_seconds <= 0) or (
        args.link_rounds < 1 or args.allreduce_mb <= 0
    ):
        raise InputError(
            "--link_seconds/--link_rounds/--allreduce_mb",
            f"{args.link_seconds}/{args.link_rounds}/{args.allreduce_mb}",
            "must be positive",
            "leave them at their defaults",
        )
    if args.nodes is not None:
        if args.nodes < 1:
            raise InputError("--nodes", args.nodes, "must be at least 1", "use e.g. --nodes=4")
        return _submit(args, runner)
    env = read_slurm_env()
    if env.job_id is None or env.nodelist is None:
        raise InputError(
            "SLURM_JOB_ID",
            None,
            "not inside an allocation",
            "run it in salloc or a job script, or pass --nodes=N to submit a check job",
        )
    nodes = len(expand_hostlist(env.nodelist))
    resv = resv_ports_args(nodes, cluster_span(runner), parse_resv_mode(env.resv_mode))
    return _in_allocation(args, nodes, runner, resv)


def probe_args(args: argparse.Namespace) -> list[str]:
    return [f"--{name}={getattr(args, name)}" for name in PROBE_FLAGS
            if getattr(args, name) is not None]  # fmt: skip


def step_command(
    nodes: int, python: str, args: argparse.Namespace, cpus: Sequence[str] = ()
) -> list[str]:
    """The ``srun`` line: one probe per node of the allocation, with ``cpus`` (extra srun
    flags: ``--resv-ports=N`` where the cluster reserves ports, :mod:`slurmtf.slurm.resv_ports`).
    It runs without the job's ``--cpus-per-task``, which steps inherit from Slurm 23.11, so
    that each probe gets its node's CPUs on every release
    (:func:`~slurmtf.cluster.step_flags.whole_node_environ`)."""
    return [
        "srun",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        *cpus,
        "--kill-on-bad-exit=1",
        "--job-name=slurmtf-check",
        python,
        "-m",
        "slurmtf.check.probe",
        *probe_args(args),
    ]


def _in_allocation(
    args: argparse.Namespace, nodes: int, runner: Runner, cpus: Sequence[str] = ()
) -> int:
    t0 = time.monotonic()
    try:
        out = runner(
            step_command(nodes, sys.executable, args, cpus),
            timeout=STEP_TIMEOUT_S,
            env=whole_node_environ(os.environ),
        )
    except ControllerSilent:
        raise  # names the srun line, Slurm's words and a HINT
    except SlurmCommandError as exc:
        raise SlurmtfError(f"the check step failed: {exc}") from exc
    found = last(parse_events(out), "check")
    if found is None:
        raise SlurmtfError(f"the check step printed no verdict:\n{out[-2000:]}")
    found["wall_seconds"] = time.monotonic() - t0
    return report(found, args.json)


def report(result: dict[str, Any], json_path: Path | None) -> int:
    """Print the table and the closing line of a ``check`` event; the exit status."""
    result = {k: v for k, v in result.items() if k != "event"}
    shown = verdict.Verdict(
        rows=tuple(result["nodes"]),
        outliers=tuple(verdict.Outlier(**o) for o in result["outliers"]),
        threshold=float(result["threshold"]),
    )
    print(verdict.table(shown))
    took = result.get("wall_seconds", result.get("seconds"))
    print(
        f"all-reduce {result.get('implementation', '')} {result.get('allreduce_mb')} MiB; "
        f"checked in {took:.1f}s"
        if took is not None
        else ""
    )
    print(verdict.closing_line(shown))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = json_path.with_name(json_path.name + ".tmp")  # appears whole: --nodes polls it
        tmp.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        tmp.replace(json_path)
    return shown.exit_status


def job_command(args: argparse.Namespace, python: str, out_dir: Path) -> list[str]:
    """The ``sbatch`` line of ``--nodes=N``: the job runs ``slurmtf check`` itself."""
    inner = [python, "-m", "slurmtf.cli", "check", *probe_args(args)]
    wrap = f"{shlex.join(inner)} --json={shlex.quote(str(out_dir))}/check-$SLURM_JOB_ID.json"
    cmd = [
        "sbatch",
        "--parsable",
        f"--nodes={args.nodes}",
        "--ntasks-per-node=1",
        "--time=10",
        "--job-name=slurmtf-check",
        f"--output={out_dir}/check-%j.out",
    ]
    if args.partition:
        cmd.append(f"--partition={args.partition}")
    return [*cmd, f"--wrap={wrap}"]


def _submit(args: argparse.Namespace, runner: Runner) -> int:
    out_dir = args.out_dir.absolute()
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    job_id = runner(job_command(args, sys.executable, out_dir)).strip().split(";")[0]
    result_path, log = out_dir / f"check-{job_id}.json", out_dir / f"check-{job_id}.out"
    print(f"check job {job_id} on {args.nodes} nodes ({log})", flush=True)
    deadline = time.monotonic() + STEP_TIMEOUT_S + 600
    while not result_path.exists() and time.monotonic() < deadline:
        states = job_states(job_id, runner)
        if states is None or all(is_final(state) for state, _ in states):
            break
        time.sleep(0.5)
    if not result_path.exists():
        if time.monotonic() >= deadline:
            runner(["scancel", job_id], check=False)
        tail = log.read_text()[-2000:] if log.exists() else ""
        raise SlurmtfError(f"check job {job_id} gave no verdict:\n{tail}")
    result = json.loads(result_path.read_text())
    result["wall_seconds"] = time.monotonic() - t0
    return report(result, args.json)
