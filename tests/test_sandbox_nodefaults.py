"""Which processes make up one sandbox node (slurmtf.sandbox.nodefaults.node_members)."""

from __future__ import annotations

from slurmtf.sandbox.nodefaults import Proc, node_members

CONF = "/srv/sbx/slurm.conf"
OTHER = "/srv/other/slurm.conf"


def task(ppid: int, node: str, conf: str = CONF, cmd: str = "python -m models.mnist") -> Proc:
    return Proc(ppid, cmd, node.encode(), conf.encode())


PROCS = {
    100: Proc(1, "slurmd -D -f /srv/sbx/slurm.conf -N node2"),
    200: Proc(1, "slurmstepd: [7.0]"),  # node2's step daemon
    201: task(200, "node2"),  # rank 1
    202: task(201, "node2", cmd="python -u child"),  # its child
    203: Proc(200, "env -i sleep 100"),  # a task that cleared its environment
    204: Proc(203, "sleep 100"),
    300: Proc(1, "slurmstepd: [7.0]"),  # node1's step daemon
    301: task(300, "node1"),
    400: Proc(1, "slurmstepd: [9.0]"),  # another sandbox's job on its own node2
    401: task(400, "node2", conf=OTHER),
    500: Proc(1, "bash"),
}


def test_a_node_is_its_slurmd_its_step_daemons_and_all_they_started() -> None:
    assert node_members(PROCS, "node2", CONF, slurmd=100) == [100, 201, 200, 202, 203, 204]


def test_another_node_and_another_sandbox_are_left_alone() -> None:
    assert node_members(PROCS, "node1", CONF) == [301, 300]
    assert node_members(PROCS, "node3", CONF) == []


def test_a_parent_loop_does_not_hang() -> None:
    looped = {**PROCS, 600: Proc(601, "x"), 601: Proc(600, "y")}
    assert 600 not in node_members(looped, "node2", CONF, slurmd=100)
