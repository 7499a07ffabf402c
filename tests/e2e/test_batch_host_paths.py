"""A lost batch host on the other launch paths and shapes: requeued, resumed, said.

Four jobs at once on a sandbox of their own (``SlurmdTimeout`` 30 s), light ranks
(``tests/scripts/steady.py``: steps, a checkpoint, a resume; no TensorFlow) but for the
bundled model and the parameter-server job's servers. Each loses its batch host at step 8:

* ``submit``: ``slurmtf submit --command="python steady.py ..." --nodes=2``; the batch
  host dies (its slurmd and every process of the job on it SIGKILLed);
* ``model``: ``slurmtf submit --model=mnist --nodes=2`` (TensorFlow: the bundled model
  resumes from its checkpoint); the batch host dies;
* ``het``: the heterogeneous parameter-server form (``sbatch -N1 -n2 : -N1
  jobs/parameter_server.sbatch``, chief and ps on component 0, a worker on component 1,
  whose node the watcher runs on); the batch host dies;
* ``one``: ``sbatch -N1 jobs/train.sbatch``, one node, which hangs (SIGSTOP): no other
  node can watch it, and Slurm requeues the job itself when it declares the node failed.

Every job is requeued without the lost host, resumes from its checkpoint elsewhere and
ends COMPLETED at the last step; the job's record names the host with the times, and
``slurmtf status`` shows it; nothing of the job is left on the nodes that live. Prints
``MEASURED`` lines (the loss to training again).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurmtf.cluster.ports import free_port_base
from slurmtf.events import named, read_events
from slurmtf.runtime.recovery.record import batch_side_lines, read_record
from slurmtf.sandbox import Sandbox, nodefaults
from tests.e2e.conftest import PYTHON, REPO, TERMINAL, SlurmSandbox, module_sandbox
from tests.e2e.jobruns import batch_side, event_step, no_process_left, trained_in_start

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SLURMD_TIMEOUT = 30
STEADY = REPO / "tests" / "scripts" / "steady.py"
STEPS = 60
MNIST_STEPS = 40
ENV = {"SLURMTF_HEARTBEAT_S": "2", "MAX_RESTARTS": "2"}
LOST = r"batch host {host} lost at \S+ \(the supervisor's last heartbeat; {host} does not answer"


@dataclasses.dataclass
class Lost:
    """One job of the module and what became of its batch host."""

    name: str
    job_id: str
    steps: int  # the last step
    folder: Path  # its log folder
    out: Path  # rank 0's events
    log: Path  # the job's own log
    how: Callable[[Sandbox, str], list[int]]  # kill_node or freeze_node
    host: str = ""
    pids: list[int] = dataclasses.field(default_factory=list)  # the processes broken
    at: float = 0.0
    again: float | None = None
    broken_at_step: int = 0

    def job_log(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@pytest.fixture(scope="module")
def paths_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    """Eleven nodes: the four jobs (whole nodes each) take seven, and start again without
    the four lost."""
    yield from module_sandbox(tmp_path_factory, "paths", nodes=11, slurmd_timeout=SLURMD_TIMEOUT)


def submit(sandbox: SlurmSandbox, folder: Path, name: str, steps: int, *flags: str) -> Lost:
    """``slurmtf submit --nodes=2 FLAGS`` from ``folder`` (its log folder)."""
    folder.mkdir(parents=True)
    done = sandbox.run(
        [PYTHON, "-m", "slurmtf.submit", "--nodes=2", "--time=15", "--max_restarts=2",
         f"--log_dir={folder}", "--exclusive", *flags],
        env={**ENV, "SLURMTF_PORT_BASE": str(free_port_base(2))}, cwd=folder,
    )  # fmt: skip
    found = re.search(r"submitted job (\d+)", done.stdout)
    assert found, done.stdout + done.stderr
    jid = found.group(1)
    out = folder / f"{jid}_0_log.out"  # rank 0's stdout is the job's log too (submitit)
    return Lost(name, jid, steps, folder, out, out, nodefaults.kill_node)


def submitted(sandbox: SlurmSandbox, root: Path) -> dict[str, Lost]:
    """The four jobs, at once."""
    steady = [str(STEADY), f"--steps={STEPS}", "--step_s=0.5"]
    command = f"{PYTHON} {' '.join(steady)} --model_dir={root / 'submit' / 'model'}"
    mnist = ["--model=mnist", "--", "--batch_size=16", "--eval_steps=1", "--num_threads=1",
             "--log_every=1", f"--train_steps={MNIST_STEPS}", "--checkpoint_every=5",
             "--heartbeat_timeout=10"]  # fmt: skip
    jobs = {
        "submit": submit(sandbox, root / "submit", "submit", STEPS, f"--command={command}"),
        "model": submit(sandbox, root / "model", "model", MNIST_STEPS, *mnist),
    }
    for name, script, shape, how in (
        ("het", "parameter_server.sbatch", ["-N1", "-n2", ":", "-N1", "--ntasks-per-node=1"],
         nodefaults.kill_node),
        ("one", "train.sbatch", ["-N1", "--ntasks-per-node=1"], nodefaults.freeze_node),
    ):  # fmt: skip
        run = root / name
        run.mkdir()
        env = {**ENV, "LOG_DIR": str(run / "logs"), "MODEL_DIR": str(run / "model"),
               "SLURMTF_PORT_BASE": str(free_port_base(3))}  # fmt: skip
        if name == "het":
            env.update(SLURMTF_JOBS="chief:1@0,ps@0,worker@1", SERVE_ARGS="--start_timeout=900",
                       TF_CPP_MIN_LOG_LEVEL="2")  # fmt: skip
        jid = sandbox.submit(
            REPO / "jobs" / script, *steady, f"--model_dir={run / 'model'}",
            sbatch_args=["--time=15", "--exclusive", f"--job-name={name}",
                         f"--output={run}/%x-%j.out", *shape],
            env=env,
        )  # fmt: skip
        log = run / f"{name}-{jid}.out"
        jobs[name] = Lost(name, jid, STEPS, run / "logs", run / "logs" / "rank0.out", log, how)
    return jobs


@pytest.fixture(scope="module")
def lost(paths_sandbox: SlurmSandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
    dict[str, Lost]
]:  # fmt: skip
    """Each job's batch host broken at step 8; returns when each trained again (or after
    the deadline); then the jobs are cancelled and every node mended."""
    jobs = submitted(paths_sandbox, tmp_path_factory.mktemp("lost"))
    yield from break_batch_hosts(paths_sandbox, jobs, lambda job: 8, 400)


def break_batch_hosts(
    sandbox: SlurmSandbox, jobs: dict[str, Lost], at_step: Callable[[Lost], float],
    seconds: float, mend_s: float = 120,
) -> Iterator[dict[str, Lost]]:  # fmt: skip
    """Break each job's batch host (``job.how``) once rank 0 logged ``at_step(job)``;
    yields ``jobs`` once each trained again (or after ``seconds``); then cancels them and
    mends every node (within ``mend_s``)."""
    deadline, ended = time.monotonic() + seconds, set()
    try:
        while time.monotonic() < deadline:
            for job in jobs.values():
                step = event_step(job.out)
                if not job.at and step >= at_step(job):
                    job.host = batch_side(job.folder, job.job_id).host
                    job.pids = job.how(sandbox.sandbox, job.host)
                    job.at, job.broken_at_step = time.monotonic(), step
                elif job.at and job.again is None and trained_in_start(job.out, 2):
                    job.again = time.monotonic() - job.at
                elif job.at and job.again is None and sandbox.state(job.job_id) in TERMINAL:
                    ended.add(job.name)  # it will not train again: its test says why
            if all(job.again is not None or job.name in ended for job in jobs.values()):
                break
            time.sleep(0.3)
        yield jobs
    finally:
        for job in jobs.values():
            sandbox.run(["scancel", job.job_id], check=False)
        broken = [pid for job in jobs.values() for pid in job.pids]
        if not nodefaults.mend(sandbox.sandbox, broken, timeout=mend_s):
            pytest.fail(f"nodes not back: {sandbox.sandbox.node_states()}")


def check(sandbox: SlurmSandbox, job: Lost) -> str:
    """Trained again without the host, from the checkpoint, to the end; the record's line."""
    assert job.at, f"job {job.job_id} never reached step 8\n{sandbox.logs(job.job_id)}"
    assert job.again is not None, f"{job.job_log()[-3000:]}\n{sandbox.logs(job.job_id)}"
    print(f"MEASURED {job.name}: batch host {job.host} lost -> training again {job.again:.1f} s "
          f"(SlurmdTimeout {SLURMD_TIMEOUT} s)")  # fmt: skip
    assert sandbox.wait(job.job_id, 240) == "COMPLETED", sandbox.logs(job.job_id)
    starts = named(read_events(job.out), "cluster")
    assert [c["restart_count"] for c in starts] == [0, 1], starts
    done = named(read_events(job.out), "done")[-1]
    assert done["step"] == job.steps, done
    assert done["start_step"] >= 5, done  # from the checkpoint
    workers = starts[-1].get("workers") or [f"{starts[-1]['node']}:0"]
    assert job.host not in {w.rsplit(":", 1)[0] for w in workers}, starts
    (line,) = batch_side_lines(read_record(job.folder, job.job_id))
    status = sandbox.run([PYTHON, "-m", "slurmtf.cli", "status", job.job_id]).stdout
    assert line in status, status
    assert no_process_left(job.job_id, job.pids) == [], job.job_log()[-3000:]
    return line


@pytest.mark.parametrize("name", ["submit", "model"])
def test_a_submitted_job_loses_its_batch_host(
    paths_sandbox: SlurmSandbox, lost: dict[str, Lost], name: str
) -> None:
    """``submit --command`` and ``submit --model``: the same hand-over to the supervisor."""
    job = lost[name]
    line = check(paths_sandbox, job)
    assert re.match(LOST.format(host=job.host), line), line
    assert line in job.job_log(), job.job_log()[-3000:]  # the watcher's line in the job's log


def test_a_heterogeneous_parameter_server_job_loses_its_batch_host(
    paths_sandbox: SlurmSandbox, lost: dict[str, Lost]
) -> None:
    job = lost["het"]
    line = check(paths_sandbox, job)
    assert re.match(LOST.format(host=job.host), line), line
    watcher = (job.folder / f"watcher-{job.job_id}.out").read_text()
    assert f"watching {job.host} (the batch host)" in watcher, watcher
    served = " ".join(p.read_text(errors="replace") for p in job.folder.glob("rank*.err"))
    assert served.count("slurmtf serve: worker 0 serving at") == 2, served[-3000:]


def test_a_one_node_job_whose_node_is_lost_is_requeued_by_slurm(
    paths_sandbox: SlurmSandbox, lost: dict[str, Lost]
) -> None:
    """Nobody else can watch: Slurm requeues the job when it declares the node failed
    (--no-kill or not), and the next start says what happened."""
    job = lost["one"]
    line = check(paths_sandbox, job)
    said = (rf"Slurm requeued job {job.job_id} while its supervisor \(pid \d+ on {job.host}\) "
            rf"still ran \(its last heartbeat at \S+\): the batch host {job.host} was lost; "
            r"started again at \S+ on node\d+ \(restart 1 of 2, MAX_RESTARTS\)")  # fmt: skip
    assert re.fullmatch(said, line), line
    assert "no other node watches" in job.job_log(), job.job_log()
