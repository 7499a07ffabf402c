"""A frozen batch host in the user's shape: jobs of several minutes, on every launch path
with a batch host, with ``-w`` and without, under the default heartbeat, frozen well
after their first save. Not in CI's run (``long``): ``pytest -m long
tests/e2e/test_user_shape.py``, on each Slurm release (``SLURMTF_SLURM_PREFIX``).

Four jobs at once on a 12-node sandbox (``SlurmdTimeout`` 60 s), each frozen (SIGSTOP of
its batch host's slurmd and every process of the job there) once it has trained
:data:`FREEZE_AT` of its steps:

* ``sbatch``: ``sbatch -N2 -w node1,node2 jobs/mnist.sbatch`` (TensorFlow);
* ``model``: ``slurmtf submit --model=mnist --nodes=2`` (TensorFlow);
* ``submit``: ``slurmtf submit --command="python steady.py ..." --nodes=2``;
* ``het``: the heterogeneous parameter-server form, ``sbatch -N1 -n2 -w node3 : -N1 -w
  node4 jobs/parameter_server.sbatch``.

Each is requeued without its frozen host (a ``-w`` job too: it asked for a node that is
gone), resumes from its last save and ends COMPLETED at its last step; no node that
lived is drained, and nothing of a job is left on it. Prints ``MEASURED`` lines (the
freeze to training again, the steps redone).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmtf.cluster.ports import free_port_base
from slurmtf.events import named, read_events
from slurmtf.runtime.recovery.record import batch_side_lines, read_record
from slurmtf.sandbox import nodefaults
from tests.e2e.conftest import PYTHON, REPO, SlurmSandbox, module_sandbox
from tests.e2e.jobruns import batch_side, event_step, no_process_left, trained_in_start

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.long]

SLURMD_TIMEOUT = 60
STEADY = REPO / "tests" / "scripts" / "steady.py"
STEADY_STEPS, STEADY_SAVE = 600, 20  # 0.5 s a step: 5 minutes, a save every 10 s
MNIST_STEPS, MNIST_SAVE = 900, 50
FREEZE_AT = 0.5  # of the job's steps: well after the first save
MNIST = ["--batch_size=16", "--eval_steps=1", "--num_threads=1", "--log_every=1",
         f"--train_steps={MNIST_STEPS}", f"--checkpoint_every={MNIST_SAVE}"]  # fmt: skip


@dataclasses.dataclass
class Shaped:
    """One job of the module and what became of its batch host."""

    name: str
    job_id: str
    steps: int
    save_every: int
    folder: Path  # its log folder
    out: Path  # rank 0's events
    host: str = ""
    frozen_at_step: int = 0
    pids: list[int] = dataclasses.field(default_factory=list)
    at: float = 0.0
    again: float | None = None


@pytest.fixture(scope="module")
def shape_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    """Twelve nodes: the four jobs take eight, and start again without the four frozen."""
    yield from module_sandbox(tmp_path_factory, "shape", nodes=12, slurmd_timeout=SLURMD_TIMEOUT)


def submitted_job(sandbox: SlurmSandbox, folder: Path, name: str, *flags: str) -> str:
    done = sandbox.run(
        [PYTHON, "-m", "slurmtf.submit", "--nodes=2", "--time=40", f"--log_dir={folder}",
         "--exclusive", *flags],
        env={"SLURMTF_PORT_BASE": str(free_port_base(2))}, cwd=folder,
    )  # fmt: skip
    found = re.search(r"submitted job (\d+)", done.stdout)
    assert found, done.stdout + done.stderr
    return found.group(1)


def start_jobs(sandbox: SlurmSandbox, root: Path) -> dict[str, Shaped]:
    jobs: dict[str, Shaped] = {}
    for name, script, shape, args in (
        ("sbatch", "mnist.sbatch", ["-N2", "-w", "node1,node2", "--ntasks-per-node=1"], MNIST),
        ("het", "parameter_server.sbatch",
         ["-N1", "-n2", "-w", "node3", ":", "-N1", "-w", "node4", "--ntasks-per-node=1"],
         [str(STEADY), f"--steps={STEADY_STEPS}", f"--checkpoint_every={STEADY_SAVE}"]),
    ):  # fmt: skip
        run = root / name
        run.mkdir()
        env = {"LOG_DIR": str(run / "logs"), "MODEL_DIR": str(run / "model"),
               "SLURMTF_PORT_BASE": str(free_port_base(3))}  # fmt: skip
        if name == "het":
            env.update(SLURMTF_JOBS="chief:1@0,ps@0,worker@1", SERVE_ARGS="--start_timeout=1800",
                       TF_CPP_MIN_LOG_LEVEL="2")  # fmt: skip
        model = [f"--model_dir={run / 'model'}"]
        jid = sandbox.submit(
            REPO / "jobs" / script, *args, *model,
            sbatch_args=["--time=40", "--exclusive", f"--job-name={name}",
                         f"--output={run}/%x-%j.out", *shape],
            env=env,
        )  # fmt: skip
        steps, save = (MNIST_STEPS, MNIST_SAVE) if name == "sbatch" else (STEADY_STEPS, STEADY_SAVE)
        jobs[name] = Shaped(name, jid, steps, save, run / "logs", run / "logs" / "rank0.out")
    for name in ("submit", "model"):
        folder = root / name
        folder.mkdir(parents=True)
        if name == "submit":
            steady = f"{PYTHON} {STEADY} --steps={STEADY_STEPS} --checkpoint_every={STEADY_SAVE}"
            flags = [f"--command={steady} --model_dir={folder / 'model'}"]
            steps, save = STEADY_STEPS, STEADY_SAVE
        else:
            flags = ["--model=mnist", "--", f"--model_dir={folder / 'model'}", *MNIST]
            steps, save = MNIST_STEPS, MNIST_SAVE
        jid = submitted_job(sandbox, folder, name, *flags)
        jobs[name] = Shaped(name, jid, steps, save, folder, folder / f"{jid}_0_log.out")
    return jobs


@pytest.fixture(scope="module")
def shaped(
    shape_sandbox: SlurmSandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Shaped]]:
    """Each job frozen at :data:`FREEZE_AT` of its steps; returns once each trained again
    (or after the deadline), with the node states then; the jobs are cancelled and every
    node mended afterwards."""
    jobs = start_jobs(shape_sandbox, tmp_path_factory.mktemp("shaped"))
    deadline = time.monotonic() + 1800
    try:
        while time.monotonic() < deadline:
            for job in jobs.values():
                step = event_step(job.out)
                if not job.at and step >= job.steps * FREEZE_AT:
                    job.host = batch_side(job.folder, job.job_id).host
                    job.pids = nodefaults.freeze_node(shape_sandbox.sandbox, job.host)
                    job.at, job.frozen_at_step = time.monotonic(), step
                elif job.at and job.again is None and trained_in_start(job.out, 2):
                    job.again = time.monotonic() - job.at
            if all(job.again is not None for job in jobs.values()):
                break
            time.sleep(0.5)
        yield jobs
    finally:
        for job in jobs.values():
            shape_sandbox.run(["scancel", job.job_id], check=False)
        broken = [pid for job in jobs.values() for pid in job.pids]
        if not nodefaults.mend(shape_sandbox.sandbox, broken, timeout=180):
            pytest.fail(f"nodes not back: {shape_sandbox.sandbox.node_states()}")


def drained_alive(sandbox: SlurmSandbox, frozen: set[str]) -> dict[str, str]:
    """Nodes that lived yet are drained (or down)."""
    states = sandbox.sandbox.node_states()
    return {n: s for n, s in states.items() if n not in frozen and ("drain" in s or "down" in s)}


@pytest.mark.parametrize("name", ["sbatch", "model", "submit", "het"])
def test_a_frozen_batch_host_of_a_long_job_costs_a_requeue_and_no_healthy_node(
    shape_sandbox: SlurmSandbox, shaped: dict[str, Shaped], name: str
) -> None:
    job = shaped[name]
    logs = shape_sandbox.logs(job.job_id)
    assert job.at, f"job {job.job_id} never reached step {job.steps * FREEZE_AT:.0f}\n{logs}"
    assert job.again is not None, f"{name}: no training after the freeze\n{logs}"
    assert shape_sandbox.wait(job.job_id, 900) == "COMPLETED", shape_sandbox.logs(job.job_id)
    starts = named(read_events(job.out), "cluster")
    assert [c["restart_count"] for c in starts] == [0, 1], starts
    done = named(read_events(job.out), "done")[-1]
    assert done["step"] == job.steps, done
    resumed = int(starts[-1]["start_step"])
    assert resumed >= job.frozen_at_step - job.save_every, (resumed, job.frozen_at_step)
    print(f"MEASURED {name}: batch host {job.host} frozen at step {job.frozen_at_step} -> "
          f"training again {job.again:.1f} s, resumed at step {resumed} "
          f"(SlurmdTimeout {SLURMD_TIMEOUT} s, a save every {job.save_every} steps)")  # fmt: skip
    workers = starts[-1].get("workers") or [f"{starts[-1]['node']}:0"]
    assert job.host not in {w.rsplit(":", 1)[0] for w in workers}, starts
    (line,) = batch_side_lines(read_record(job.folder, job.job_id))
    assert f"batch host {job.host} lost at " in line, line
    status = shape_sandbox.run([PYTHON, "-m", "slurmtf.cli", "status", job.job_id]).stdout
    assert line in status, status
    frozen = {j.host for j in shaped.values()}
    assert drained_alive(shape_sandbox, frozen) == {}, shape_sandbox.sandbox.node_states()
    assert no_process_left(job.job_id, job.pids) == [], logs
