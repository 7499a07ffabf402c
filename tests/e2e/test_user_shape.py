"""A frozen batch host in the user's shape: jobs of several minutes, on every launch path
with a batch host, with ``-w`` and without, under the default heartbeat, frozen well
after their first save. Not in CI's run (``long``): ``pytest -m long
tests/e2e/test_user_shape.py``, on each Slurm release (``SLURMTF_SLURM_PREFIX``).

Four jobs at once on a 12-node sandbox (``SlurmdTimeout`` 60 s), each frozen (SIGSTOP of
its batch host's slurmd and every process of the job there) once it has trained
:data:`FREEZE_AT` of its steps and :data:`AFTER_SAVE` more (between two saves):

* ``sbatch``: ``sbatch -N2 -w node1,node2 jobs/mnist.sbatch`` (TensorFlow);
* ``model``: ``slurmtf submit --model=mnist --nodes=2`` (TensorFlow);
* ``submit``: ``slurmtf submit --command="python steady.py ..." --nodes=2``;
* ``het``: the heterogeneous parameter-server form, ``sbatch -N1 -n2 : -N1 -w node4
  jobs/parameter_server.sbatch`` (``-w`` on its second component: scontrol cannot change
  the first component's ReqNodeList, so a job pinned there to its lost batch host waits
  for it, and says so: tests/test_requeue_nodes.py).

The jobs choose their ports as a user's do (no ``SLURMTF_PORT_BASE``): on the sandbox the
nodes share one network stack, where a frozen rank still holds its port, and a fixed base
would put the requeued rank on that same port.

Each is requeued without its frozen host (a ``-w`` job too: it asked for a node that is
gone), resumes from its last save and ends COMPLETED at its last step; no node that
lived is drained, and nothing of a job is left on it. Prints ``MEASURED`` lines (the
freeze to training again, the steps redone).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmtf.events import named, read_events
from slurmtf.runtime.recovery.record import batch_side_lines, read_record
from slurmtf.sandbox import nodefaults
from tests.e2e.conftest import PYTHON, REPO, SlurmSandbox, module_sandbox
from tests.e2e.jobruns import no_process_left
from tests.e2e.test_batch_host_paths import Lost, break_batch_hosts

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.long]

SLURMD_TIMEOUT = 60
STEADY = REPO / "tests" / "scripts" / "steady.py"
STEADY_STEPS, STEADY_SAVE = 600, 20  # 0.5 s a step: 5 minutes, a save every 10 s
MNIST_STEPS, MNIST_SAVE = 900, 50
SAVE_EVERY = {"sbatch": MNIST_SAVE, "model": MNIST_SAVE, "submit": STEADY_SAVE, "het": STEADY_SAVE}
FREEZE_AT = 0.5  # of the job's steps: well after the first save
AFTER_SAVE = 13  # steps past that: between two saves, so the save it resumes from tells
MNIST = ["--batch_size=16", "--eval_steps=1", "--num_threads=1", "--log_every=1",
         f"--train_steps={MNIST_STEPS}", f"--checkpoint_every={MNIST_SAVE}"]  # fmt: skip


@pytest.fixture(scope="module")
def shape_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    """Twelve nodes: the four jobs take eight, and start again without the four frozen."""
    yield from module_sandbox(tmp_path_factory, "shape", nodes=12, slurmd_timeout=SLURMD_TIMEOUT)


def submitted_job(sandbox: SlurmSandbox, folder: Path, name: str, *flags: str) -> str:
    done = sandbox.run(
        [PYTHON, "-m", "slurmtf.submit", "--nodes=2", "--time=40", f"--log_dir={folder}",
         "--exclusive", *flags],
        cwd=folder,
    )  # fmt: skip
    found = re.search(r"submitted job (\d+)", done.stdout)
    assert found, done.stdout + done.stderr
    return found.group(1)


def start_jobs(sandbox: SlurmSandbox, root: Path) -> dict[str, Lost]:
    jobs: dict[str, Lost] = {}
    for name, script, shape, args in (
        ("sbatch", "mnist.sbatch", ["-N2", "-w", "node1,node2", "--ntasks-per-node=1"], MNIST),
        ("het", "parameter_server.sbatch",
         ["-N1", "-n2", ":", "-N1", "-w", "node4", "--ntasks-per-node=1"],
         [str(STEADY), f"--steps={STEADY_STEPS}", f"--checkpoint_every={STEADY_SAVE}"]),
    ):  # fmt: skip
        run = root / name
        run.mkdir()
        env = {"LOG_DIR": str(run / "logs"), "MODEL_DIR": str(run / "model")}
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
        steps = MNIST_STEPS if name == "sbatch" else STEADY_STEPS
        log = run / f"{name}-{jid}.out"
        jobs[name] = Lost(name, jid, steps, run / "logs", run / "logs" / "rank0.out", log,
                          nodefaults.freeze_node)  # fmt: skip
    for name in ("submit", "model"):
        folder = root / name
        folder.mkdir(parents=True)
        if name == "submit":
            steady = f"{PYTHON} {STEADY} --steps={STEADY_STEPS} --checkpoint_every={STEADY_SAVE}"
            flags = [f"--command={steady} --model_dir={folder / 'model'}"]
            steps = STEADY_STEPS
        else:
            flags = ["--model=mnist", "--", f"--model_dir={folder / 'model'}", *MNIST]
            steps = MNIST_STEPS
        jid = submitted_job(sandbox, folder, name, *flags)
        out = folder / f"{jid}_0_log.out"
        jobs[name] = Lost(name, jid, steps, folder, out, out, nodefaults.freeze_node)
    return jobs


@pytest.fixture(scope="module")
def shaped(
    shape_sandbox: SlurmSandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Lost]]:
    """Each job frozen at :data:`FREEZE_AT` of its steps; returns once each trained again
    (or after the deadline), with the node states then; the jobs are cancelled and every
    node mended afterwards."""
    jobs = start_jobs(shape_sandbox, tmp_path_factory.mktemp("shaped"))
    yield from break_batch_hosts(shape_sandbox, jobs, frozen_at, 1800, 180)


def frozen_at(job: Lost) -> float:
    """The step a job's batch host is frozen at."""
    return job.steps * FREEZE_AT + AFTER_SAVE


def drained_alive(sandbox: SlurmSandbox, frozen: set[str]) -> dict[str, str]:
    """Nodes that lived yet are drained (or down)."""
    states = sandbox.sandbox.node_states()
    return {n: s for n, s in states.items() if n not in frozen and ("drain" in s or "down" in s)}


@pytest.mark.parametrize("name", ["sbatch", "model", "submit", "het"])
def test_a_frozen_batch_host_of_a_long_job_costs_a_requeue_and_no_healthy_node(
    shape_sandbox: SlurmSandbox, shaped: dict[str, Lost], name: str
) -> None:
    job = shaped[name]
    logs = shape_sandbox.logs(job.job_id)
    assert job.at, f"job {job.job_id} never reached step {frozen_at(job):.0f}\n{logs}"
    assert job.again is not None, f"{name}: no training after the freeze\n{logs}"
    assert shape_sandbox.wait(job.job_id, 900) == "COMPLETED", shape_sandbox.logs(job.job_id)
    starts = named(read_events(job.out), "cluster")
    assert [c["restart_count"] for c in starts] == [0, 1], starts
    done = named(read_events(job.out), "done")[-1]
    assert done["step"] == job.steps, done
    resumed = int(starts[-1].get("start_step", done.get("start_step", -1)))
    source = (named(read_events(job.out), "resumed") or [{"source": "its own save"}])[-1]
    print(f"MEASURED {name}: batch host {job.host} frozen at step {job.broken_at_step} -> "
          f"training again {job.again:.1f} s, resumed at step {resumed} from "
          f"{source['source']} (SlurmdTimeout {SLURMD_TIMEOUT} s, a save every "
          f"{SAVE_EVERY[name]} steps)")  # fmt: skip
    if name in ("sbatch", "model"):  # TensorFlow: the survivor saved the step it held
        assert "memory" in str(source["source"]), source
        assert resumed >= job.broken_at_step - 1, (resumed, job.broken_at_step)
    else:  # the light ranks save every SAVE_EVERY steps
        assert resumed >= job.broken_at_step - SAVE_EVERY[name], (resumed, job.broken_at_step)
    workers = starts[-1].get("workers") or [f"{starts[-1]['node']}:0"]
    assert job.host not in {w.rsplit(":", 1)[0] for w in workers}, starts
    (line,) = batch_side_lines(read_record(job.folder, job.job_id))
    assert f"batch host {job.host} lost at " in line, line
    status = shape_sandbox.run([PYTHON, "-m", "slurmtf.cli", "status", job.job_id]).stdout
    assert line in status, status
    frozen = {j.host for j in shaped.values()}
    assert drained_alive(shape_sandbox, frozen) == {}, shape_sandbox.sandbox.node_states()
    assert no_process_left(job.job_id, job.pids) == [], logs
