"""``slurmtf job KIND [OPTIONS] -- [ARGS...]``: the supervisor of a batch job.

Every job script hands its job over to it (``exec python3 -m slurmtf job mnist -- "$@"``),
and so do the jobs ``slurmtf submit`` writes (their ``srun`` line, ``KIND`` submitit).
It runs the job's srun steps, restarts them in place, requeues, and ends with the
job's status (:mod:`slurmtf.runtime.job.supervisor`). The process the job script execs into
is the supervisor's keeper (:mod:`slurmtf.runtime.batch_host.keeper`): it forks the supervisor and
starts it again when it dies. KIND is one of mnist, resnet (the
bundled models; ARGS are model flags), train (ARGS: your script and its arguments),
parameter_server (the same, under ParameterServerStrategy), command (ARGS: any command
every rank runs) or submitit (ARGS: submitit's srun line without ``srun``).

The settings are the environment variables the job scripts document (MODEL_DIR,
LOG_DIR, PYTHON, CONTAINER, MAX_RESTARTS, SPARE_NODES, MIN_NODES, TASKS_PER_NODE,
STAGE_DATA, DATA_DIR, CHECK_FIRST, ...); an option given here wins over its variable.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Mapping, Sequence

from slurmtf.cli import ArgumentParser, add_flag, report_error
from slurmtf.contracts import EXIT_USAGE
from slurmtf.errors import InputError, SlurmtfError, UsageError
from slurmtf.runtime.batch_host.heartbeat import Beat, beat_path
from slurmtf.runtime.batch_host.keeper import Ending, Keeper
from slurmtf.runtime.job.settings import JOB_KINDS, JobSettings, JobStop, submitit_logs
from slurmtf.runtime.job.supervisor import Supervisor
from slurmtf.runtime.job_log import log
from slurmtf.slurm.runner import default_runner

PROGRAM = "slurmtf job"
# option -> the environment variable it stands for
OPTIONS = {
    "log_dir": "LOG_DIR",
    "max_restarts": "MAX_RESTARTS",
    "restart_budget": "RESTART_BUDGET",
    "max_failures_per_hour": "MAX_FAILURES_PER_HOUR",
    "spare_nodes": "SPARE_NODES",
    "min_nodes": "MIN_NODES",
    "data_dir": "DATA_DIR",
    "container": "CONTAINER",
    "container_python": "CONTAINER_PYTHON",
    "python": "PYTHON",
}


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROGRAM, usage="slurmtf job KIND [OPTIONS] -- [ARGS...]",
                            description=__doc__)  # fmt: skip
    parser.add_argument("kind", choices=JOB_KINDS)
    add_flag(parser, "log_dir", help="the job's log folder [LOG_DIR]")
    add_flag(parser, "max_restarts", help="restarts in place or requeues [MAX_RESTARTS, 3]")
    add_flag(
        parser,
        "restart_budget",
        help="what --max_restarts counts: progress or total [RESTART_BUDGET, progress]",
    )
    add_flag(
        parser,
        "max_failures_per_hour",
        help="failures within an hour that stop the job [MAX_FAILURES_PER_HOUR, 0: none]",
    )
    add_flag(parser, "spare_nodes", help="nodes kept idle for a lost node's place [SPARE_NODES]")
    add_flag(parser, "min_nodes", help="fewest nodes to go on with [MIN_NODES]")
    add_flag(parser, "data_dir", help="the data set to stage [DATA_DIR]")
    add_flag(parser, "container", help="prefix of every rank's command [CONTAINER]")
    add_flag(parser, "container_python",
             help="the ranks' interpreter in --container [CONTAINER_PYTHON, python3]")  # fmt: skip
    add_flag(parser, "python", help="the ranks' interpreter [PYTHON, python3]")
    add_flag(parser, "stage_data", action="store_true", help="stage --data_dir first [STAGE_DATA]")
    add_flag(parser, "check_first", action="store_true", help="slurmtf check first [CHECK_FIRST]")
    add_flag(parser, "servers", action="store_true",
             help="a parameter-server step: a failed task does not end it")  # fmt: skip
    return parser


def settings(
    argv: Sequence[str], environ: Mapping[str, str]
) -> tuple[JobSettings, list[str], dict[str, str]]:
    """The job's settings, its arguments (after ``--``) and the ranks' environment."""
    at = list(argv).index("--") if "--" in argv else len(argv)
    head, args = list(argv[:at]), list(argv[at + 1 :])
    if len(head) > 1 and "--" not in argv:  # no options without --: all are arguments
        head, args = head[:1], head[1:]
    options = _parser().parse_args(head)
    env = dict(environ)
    for name, variable in OPTIONS.items():
        if getattr(options, name) is not None:
            env[variable] = getattr(options, name)
    if options.stage_data:
        env["STAGE_DATA"] = "1"
    if options.check_first:
        env["CHECK_FIRST"] = "1"
    job = JobSettings.read(options.kind, env)
    if job.kind == "submitit":
        job = dataclasses.replace(job, logs=submitit_logs(job.job_id))
    if options.servers:
        job = dataclasses.replace(job, servers=True)
    return job, args, env


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    environ = os.environ if environ is None else environ
    try:
        job, args, env = settings(argv, environ)
    except (UsageError, InputError) as exc:
        return report_error(PROGRAM, exc)

    def supervise(pipe: int, previous: Ending | None) -> int:
        return _supervise(job, args, env, pipe, previous)

    base = Beat(job.job_id, job.slurm.nodename or "", 0, os.getpid(), 0, time.time())
    # At most one start more than the budget: the budget itself is the supervisor's to count.
    path = beat_path(job.log_dir, job.job_id)
    keeper = Keeper(supervise, path, base, job.beat_s, job.budget + 1, kind=job.kind)
    return keeper.run()


def _supervise(
    job: JobSettings, args: list[str], env: dict[str, str], pipe: int, previous: Ending | None
) -> int:
    """The supervisor, in the keeper's child: the job's status."""
    try:
        return Supervisor(job, args, env, default_runner, pipe=pipe, previous=previous).run()
    except JobStop as exc:
        log(str(exc), error=True)
        return exc.status
    except SlurmtfError as exc:
        log(str(exc), error=True)
        return EXIT_USAGE if isinstance(exc, InputError | UsageError) else 1
