"""Another user's job waiting for the same nodes: what a requeue loses on a busy cluster.

On a real cluster the nodes a job releases go to the next job in line. On the sandbox,
:func:`submit_competitor` submits that job while ours runs: an exclusive ``sleep`` as
another user (``sbatch --uid``, root only; by default root itself, see :data:`USER`) for
as many nodes as ours holds, so it
pends (reason ``Resources``) for as long as ours keeps its allocation, and takes the
nodes the moment ours leaves it (a requeue, the end). Tests assert
``competitor.state() == "PENDING"`` while a job recovers in place, and benchmarks see
how long a requeued job waits behind it.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurmtf.errors import InputError
from slurmtf.sandbox.core import Sandbox

NAME = "competitor"
# "": submitted as the caller (root). A job of ``nobody`` fails at its start when the
# sandbox directory is private (pytest's temporary directories are mode 700): its
# TaskProlog cannot be executed. The queue order, not the user, is what matters here.
USER = ""


def competitor_args(nodes: int, seconds: int, nodelist: str = "", user: str = USER) -> list[str]:
    """The ``sbatch`` command line of the competing job (pure, unit-tested)."""
    if nodes < 1:
        raise InputError("nodes", nodes, "must be at least 1", "ask for the nodes your job holds")
    if seconds < 1:
        raise InputError("seconds", seconds, "must be at least 1", "use e.g. 120")
    args = ["sbatch", "--parsable", f"--job-name={NAME}", "--exclusive", f"--nodes={nodes}"]
    args += [f"--uid={user}"] if user else []
    args += [f"--nodelist={nodelist}"] if nodelist else []
    args += ["--chdir=/tmp", "--output=/dev/null", "--time=60", f"--wrap=sleep {seconds}"]
    return args


@dataclass(frozen=True)
class Competitor:
    """A submitted competing job; ``state()``, ``nodes()``, ``cancel()``."""

    sandbox: Sandbox
    job_id: str

    def _field(self, fmt: str) -> str:
        args = ["squeue", "-h", "-t", "all", "-j", self.job_id, "-o", fmt]
        done = self.sandbox.run(args, timeout=15, check=False)
        return done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""

    def state(self) -> str:
        """PENDING while it waits for our nodes, RUNNING once it has them, "" when gone."""
        return self._field("%T")

    def nodes(self) -> str:
        """The nodes it runs on ("" while pending)."""
        return self._field("%N")

    def cancel(self) -> None:
        self.sandbox.run(["scancel", self.job_id], timeout=15, check=False)


def submit_competitor(
    sandbox: Sandbox, nodes: int = 2, seconds: int = 120, nodelist: str = "", user: str = USER
) -> Competitor:
    """Submit another user's exclusive job for ``nodes`` nodes (``nodelist``: those ones)."""
    done = sandbox.run(competitor_args(nodes, seconds, nodelist, user), timeout=30)
    return Competitor(sandbox, done.stdout.strip().split(";")[0])
