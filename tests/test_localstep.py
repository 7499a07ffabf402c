"""One Slurm step on this machine: the rank environment, scrubbing, ports, starting ranks."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from slurmtf.cluster.ports import free_port_base
from slurmtf.events import last, named, parse_events
from slurmtf.local.step import LocalStep, node_names, scrubbed_env, start_rank
from slurmtf.resolver import resolve


def test_block_distribution_over_loopback_nodes() -> None:
    step = LocalStep(node_names(2), tasks_per_node=2, job_id=5)
    env = step.rank_env(3)
    assert env["SLURM_NODEID"] == "1"
    assert env["SLURM_LOCALID"] == "1"
    assert env["SLURMD_NODENAME"] == "127.0.0.2"
    assert env["SLURM_STEP_TASKS_PER_NODE"] == "2(x2)"
    assert env["SLURM_STEP_ID"] == "0"
    layout = resolve(env)
    assert layout.task_index == 3
    assert layout.workers[3].startswith("127.0.0.2:")


def test_one_node_step_with_a_port_base() -> None:
    env = LocalStep(tasks_per_node=2, job_id=42, port_base=23456).rank_env(1)
    assert env["SLURM_PROCID"] == "1"
    assert env["SLURM_STEP_NUM_TASKS"] == "2"
    assert env["SLURM_STEP_TASKS_PER_NODE"] == "2"
    assert env["SLURM_STEP_NODELIST"] == "localhost"
    assert env["SLURMTF_PORT_BASE"] == "23456"
    assert resolve(env).workers == ("localhost:23456", "localhost:23457")
    with pytest.raises(ValueError, match="rank"):
        LocalStep(tasks_per_node=2).rank_env(2)


@pytest.mark.parametrize(
    ("size", "counts", "nodes"), [(20, "8(x2),4", 3), (8, "8", 1), (5, "5", 1), (9, "8,1", 2)]
)
def test_a_short_last_node_is_written_as_slurm_does(size: int, counts: str, nodes: int) -> None:
    names = tuple(f"node{n:04d}" for n in range(1, 4))
    step = LocalStep(names, 8, num_tasks=size)
    env = step.rank_env(size - 1)
    assert env["SLURM_STEP_TASKS_PER_NODE"] == counts
    assert env["SLURM_STEP_NUM_NODES"] == str(nodes)
    assert resolve(env).num_workers == size


def test_scrubbed_env_drops_slurm_tf_config_and_gpus() -> None:
    base = {
        "PATH": "/bin",
        "SLURM_JOB_ID": "1",
        "SLURMD_NODENAME": "n1",
        "SLURMTF_PORT_BASE": "1",
        "TF_CONFIG": "{}",
        "CUDA_VISIBLE_DEVICES": "0",
    }
    assert scrubbed_env(base, {"X": "1"}) == {"PATH": "/bin", "X": "1"}


def test_free_port_base_gives_bindable_ports() -> None:
    base = free_port_base(3)
    for port in range(base, base + 3):
        with socket.socket() as sock:  # as gRPC binds: a TIME_WAIT of another run is no holder
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("", port))


def test_start_rank_writes_its_own_logs(tmp_path: Path) -> None:
    code = 'import sys; print(\'{"event": "done", "step": 3}\'); sys.stderr.write("e")'
    out, err = tmp_path / "r.out", tmp_path / "r.err"
    proc = start_rank([sys.executable, "-c", code], scrubbed_env(), out, err)
    assert proc.wait(30) == 0
    assert named(parse_events(out.read_text()), "done") == [{"event": "done", "step": 3}]
    assert err.read_text() == "e"


def test_parse_events_keeps_only_json_event_lines() -> None:
    out = 'noise\n{"event": "done", "step": 3}\n{"no_event": 1}\n{broken\n  {"event": "x"}  \n'
    assert parse_events(out) == [{"event": "done", "step": 3}, {"event": "x"}]
    assert last(parse_events(out), "x") == {"event": "x"}
    assert last(parse_events(out), "y") is None
