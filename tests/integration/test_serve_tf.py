"""``slurmtf serve`` with TensorFlow: a ParameterServerStrategy step of three local ranks.

Every rank runs the same line, ``python -m slurmtf.serve -- python chief.py``; the chief
trains through ``ClusterCoordinator`` on the ps and the worker, then ends with status 3,
and the servers must stop by themselves, without a signal.
"""

from __future__ import annotations

import importlib.util
import subprocess
import time
from pathlib import Path

import pytest

from slurmtf.local.step import LocalStep, free_port_base, scrubbed_env, start_rank
from tests.helpers.localjobs import PYTHON, REPO, SINGLE_THREADED
from tests.prereqs import require

pytestmark = pytest.mark.tf

CHIEF = """
import tensorflow as tf
from slurmtf.resolver import cluster_resolver

strategy = tf.distribute.experimental.ParameterServerStrategy(
    cluster_resolver(keras_fit=False, flat_memory=False)
)
coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    total = tf.Variable(0.0)

@tf.function
def step():
    total.assign_add(1.0)
    return total.read_value()

for _ in range(5):
    coordinator.schedule(step)
coordinator.join()
print("TOTAL", float(total.numpy()), flush=True)
raise SystemExit(3)  # however the chief's script ends, the servers stop
"""


def test_servers_stop_when_the_chief_script_ends(tmp_path: Path) -> None:
    require(importlib.util.find_spec("tensorflow") is not None, "tensorflow (pip install .[cpu])")
    script = tmp_path / "chief.py"
    script.write_text(CHIEF)
    step = LocalStep(nodes=("localhost",), tasks_per_node=3, port_base=free_port_base(3))
    argv = [PYTHON, "-m", "slurmtf.serve", "--poll=0.5", "--start_timeout=120", "--"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(3):
            extra = step.rank_env(rank) | SINGLE_THREADED | {"SLURMTF_JOBS": "chief:1,ps:1,worker"}
            out, err = tmp_path / f"rank{rank}.out", tmp_path / f"rank{rank}.err"
            env = scrubbed_env(extra=extra | {"PYTHONPATH": str(REPO)})
            procs.append(start_rank([*argv, PYTHON, str(script)], env, out, err, cwd=REPO))
        chief_status = procs[0].wait(timeout=240)
        ended = time.monotonic()
        statuses = [proc.wait(timeout=30) for proc in procs[1:]]
        stopped_after = time.monotonic() - ended
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    logs = "\n".join(
        f"--- rank {r}:\n{(tmp_path / f'rank{r}.out').read_text()}"
        f"{(tmp_path / f'rank{r}.err').read_text()[-2000:]}"
        for r in range(3)
    )
    assert chief_status == 3, logs
    assert "TOTAL 5.0" in (tmp_path / "rank0.out").read_text(), logs
    assert statuses == [0, 0], logs
    for rank, role in ((1, "ps 0"), (2, "worker 0")):
        err = (tmp_path / f"rank{rank}.err").read_text()
        assert f"slurmtf serve: {role} serving at localhost:{step.port_base + rank}" in err
        assert "stopped answering: its script ended" in err, logs
    print(f"MEASURED servers stopped {stopped_after:.1f}s after the chief's script ended")
    assert stopped_after < 10, logs
