"""``slurmtf serve`` without TensorFlow: watching the chief, the role checks, the chief's exec."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmtf.cli.serve import main
from slurmtf.local.step import LocalStep, scrubbed_env
from slurmtf.runtime.rank.chief_watch import MISSES, Chief, ChiefNeverStarted, answers
from slurmtf.runtime.rank.servers import watch_chief
from tests.conftest import FakeSlurmEnv


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A real server socket standing for the chief's server."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock


def test_servers_stop_when_the_chief_stops_answering(listener: socket.socket) -> None:
    chief = Chief("127.0.0.1", listener.getsockname()[1])
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            listener.close()  # the chief's script ends

    why = watch_chief(chief, poll=0.25, sleep=sleep)
    assert why == f"the chief's server at {chief} stopped answering: its script ended"
    assert sleeps == [0.25] * (3 + MISSES - 1)
    assert not answers(chief.host, chief.port)


def test_one_missed_probe_is_not_the_end() -> None:
    seen = iter([False, True, False, True, True, False, False, True])
    probes: list[int] = []

    def probe(host: str, port: int) -> bool:
        probes.append(port)
        return next(seen)

    watch_chief(Chief("h", 1), probe=probe, sleep=lambda _: None)
    assert len(probes) == 7  # before it started, one blip, then two misses in a row


def test_a_chief_that_never_starts_is_an_error_after_the_timeout() -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with pytest.raises(
        ChiefNeverStarted, match=r"^the chief at n1:12000 did not answer within 30 s$"
    ):
        watch_chief(
            Chief("n1", 12000), start_timeout=30, poll=1, probe=lambda h, p: False,
            clock=lambda: now[0], sleep=sleep,
        )  # fmt: skip
    assert now[0] == 30


def test_a_done_file_ends_the_server(tmp_path: Path, listener: socket.socket) -> None:
    done = tmp_path / "done"
    chief = Chief("127.0.0.1", listener.getsockname()[1])
    why = watch_chief(chief, done_file=done, sleep=lambda _: done.touch())
    assert why == f"the done file {done} exists"


ROLE_ERRORS = [
    # (SLURMTF_JOBS, rank, arguments, words of the one-line error)
    (None, 1, [], "SLURMTF_JOBS=None: is not set, so every task is a worker"),
    ("chief:1,ps:1,worker", 0, [], "makes this task (rank 0) the chief, which runs the training"),
    ("worker:2,evaluator", 2, [], "the evaluator, which runs the training script"),
    ("worker:2,evaluator", 0, [], "gives the step no chief, whose end would stop the servers"),
    ("chief:1,ps:1,worker", 0, ["--", "/no/such/program"], "command='/no/such/program': cannot"),
    ("chief:1,ps:1,worker", 1, ["--poll=0"], "--poll=0.0: is not positive"),
    ("chief:1,ps:5,worker", 1, [], "SLURMTF_JOBS='chief:1,ps:5,worker': asks for at least 7"),
]


@pytest.mark.parametrize(("jobs", "rank", "args", "problem"), ROLE_ERRORS)
def test_bad_roles_are_one_line(  # noqa: PLR0917
    fake_slurm_env: FakeSlurmEnv,
    capsys: pytest.CaptureFixture[str],
    jobs: str | None,
    rank: int,
    args: list[str],
    problem: str,
) -> None:
    fake_slurm_env.step("n[1-3]", "1(x3)", rank, SLURMTF_JOBS=jobs)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("slurmtf serve: "), err
    assert problem in err
    assert "HINT:" in err
    assert len(err.splitlines()) == 1


def test_the_chief_runs_the_command_with_tf_config(tmp_path: Path) -> None:
    """On the chief the command replaces the process: its output and exit status."""
    step = LocalStep(nodes=("localhost",), tasks_per_node=3, port_base=15000)
    env = scrubbed_env(extra=step.rank_env(0) | {"SLURMTF_JOBS": "chief:1,ps:1,worker"})
    show = "import os, sys; print(os.environ['TF_CONFIG']); sys.exit(3)"
    done = subprocess.run(
        [sys.executable, "-m", "slurmtf.serve", "--", sys.executable, "-c", show],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert json.loads(done.stdout) == {
        "cluster": {
            "chief": ["localhost:15000"], "ps": ["localhost:15001"], "worker": ["localhost:15002"]
        },
        "task": {"type": "chief", "index": 0},
    }  # fmt: skip
    assert "tensorflow" not in done.stderr.lower()


def test_serve_imports_no_tensorflow_until_a_server_starts() -> None:
    code = "import sys, slurmtf.cli.serve; print('tensorflow' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
