"""A requeue never asks what the cluster cannot give (slurmtf/slurm/node_states.py,
slurm_calls.requeue): nodes are excluded only while the partition can still give the
job's node count without them; a drained or down node leaves ReqNodeList; a job Slurm
cannot start says why and what an admin runs (noderange.admin_line). A fake runner."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

import pytest

from slurmtf.runtime import slurm_calls
from slurmtf.slurm.node_states import meetable_exclusion
from slurmtf.spec.noderange import admin_line

IDLE2 = {"node1": "idle", "node2": "idle"}
IDLE3 = {**IDLE2, "node3": "idle"}


@pytest.mark.parametrize(
    ("exclude", "states", "needed", "before", "outcome"),
    [
        (("node2",), IDLE3, 2, (), (("node2",), False)),  # node3 is left
        (("node2",), IDLE2, 2, (), ((), True)),  # -N2 of 2 nodes: kept
        (("node2",), {**IDLE2, "node2": "drained"}, 2, (), (("node2",), False)),  # costs nothing
        (("node2",), IDLE3, 2, ("node3",), ((), True)),  # an earlier exclusion counts
        (("node2",), {}, 2, (), (("node2",), False)),  # sinfo did not tell
        ((), IDLE2, 2, (), ((), False)),
    ],
)
def test_meetable_exclusion(
    exclude: tuple[str, ...],
    states: dict[str, str],
    needed: int,
    before: tuple[str, ...],
    outcome: tuple[tuple[str, ...], bool],
) -> None:
    """``outcome``: the nodes excluded, and whether a line says some were kept."""
    choice = meetable_exclusion(exclude, states, needed, before)
    assert (choice.exclude, bool(choice.line)) == outcome


class Slurm:
    """scontrol show job answers ``fields`` (then ``after`` once requeued and updated);
    sinfo the partition's ``states``."""

    def __init__(self, states: dict[str, str], fields: str, after: str = "") -> None:
        self.states, self.fields, self.after = states, fields, after or fields
        self.calls: list[str] = []

    def __call__(self, args: Sequence[str], **_: Any) -> str:
        self.calls.append(shlex.join(args))
        if args[0] == "sinfo":
            return "".join(f"{n} {s}\n" for n, s in self.states.items())
        if args[:3] == ["scontrol", "show", "job"]:
            shown = sum(1 for c in self.calls if c.startswith("scontrol show job"))
            return self.fields if shown == 1 else self.after
        return ""


JOB = "JobId=7 JobState=PENDING Reason=BeginTime Partition=debug NumNodes=2 "


def test_a_requeue_that_would_make_n_unmeetable_keeps_the_node() -> None:
    slurm, said = Slurm(IDLE2, JOB + "ReqNodeList=(null) ExcNodeList=(null)"), []
    assert slurm_calls.requeue("7", ("node2",), slurm, said.append, sleep=lambda _: None)
    assert [c for c in slurm.calls if c.startswith("scontrol update")] == []
    assert "sinfo --noheader --Node --partition=debug '--format=%N %T'" in slurm.calls
    assert said == [
        "the restarted job does not avoid node(s) node2: without them its partition has 1 "
        "node(s) in service for the 2 it asks, and it could never start"
    ]


def test_a_requeue_with_a_spare_node_excludes_and_unpins_it() -> None:
    slurm, said = Slurm(IDLE3, JOB + "ReqNodeList=node[1-2] ExcNodeList=(null)"), []
    assert slurm_calls.requeue("7", ("node1",), slurm, said.append, sleep=lambda _: None)
    assert [c for c in slurm.calls if c.startswith("scontrol update")] == [
        "scontrol update JobId=7 ExcNodeList=node1",
        "scontrol update JobId=7 ReqNodeList=node2",
    ]


def test_a_drained_node_never_stays_in_req_node_list() -> None:
    states = {**IDLE3, "node2": "drained"}
    after = ("JobId=7 JobState=PENDING Reason=ReqNodeNotAvail Partition=debug NumNodes=2 "
             "ReqNodeList=node1 ExcNodeList=node2")  # fmt: skip
    slurm, said = Slurm(states, JOB + "ReqNodeList=node[1-2] ExcNodeList=(null)", after), []
    assert slurm_calls.requeue("7", (), slurm, said.append, sleep=lambda _: None)
    assert [c for c in slurm.calls if c.startswith("scontrol update")] == [
        "scontrol update JobId=7 ReqNodeList=node1"
    ]
    assert said[-1].startswith("why: ")


@pytest.mark.parametrize(
    ("fields", "unavailable", "expected"),
    [
        (
            {
                "Reason": "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved",
                "ReqNodeList": "node2",
            },
            {"node2": "drain (Kill task failed)", "node3": "down"},
            "  why: it needs node(s) Slurm took out of service (node2 drain (Kill task "
            "failed)); HINT: an admin runs `scontrol update nodename=node2 state=resume` once "
            "they are fine",
        ),
        (
            {"Reason": "BadConstraints", "ExcNodeList": "node2"},
            {},
            "  why: the nodes left without node2 (ExcNodeList) cannot give its node count; "
            "HINT: `scontrol update jobid=7 ExcNodeList=` lets it start",
        ),
        (
            {"Reason": "ReqNodeNotAvail,_UnavailableNodes:node3"},
            {"node3": "down"},
            "  why: it needs node(s) Slurm took out of service (node3 down); HINT: an admin "
            "runs `scontrol update nodename=node3 state=resume` once they are fine",
        ),
        ({"Reason": "Resources"}, {"node3": "down"}, None),
        ({"Reason": "Priority"}, {}, None),
    ],
)
def test_the_pending_line_says_why_and_what_an_admin_runs(
    fields: dict[str, str], unavailable: dict[str, str], expected: str | None
) -> None:
    assert admin_line("7", {"JobState": "PENDING", **fields}, unavailable) == expected
    assert admin_line("7", {"JobState": "RUNNING", **fields}, unavailable) is None


IDLE6 = {f"node{n}": "idle" for n in range(1, 7)}
HET = "JobState=PENDING Reason=BeginTime Partition=debug NumNodes=1 HetJobId=7 "


def het_job(first: str, second: str) -> str:
    """``scontrol show job 7`` of a heterogeneous job: component 0 (JobId 7) and 1 (8),
    each with its ReqNodeList and the ExcNodeList Slurm gives it (the other's nodes)."""
    return f"JobId=7 {HET}{first}\n\nJobId=8 {HET}{second}\n"


def test_each_component_of_a_heterogeneous_job_keeps_its_own_lists() -> None:
    """``-N1 -n2 : -N1 -w node4``, its batch host node3 lost: the first component's update
    (by the job's id) sets every component's ExcNodeList, so the second sets its own again."""
    shown = het_job("ReqNodeList=(null) ExcNodeList=node4", "ReqNodeList=node4 ExcNodeList=(null)")
    slurm, said = Slurm(IDLE6, shown), []
    assert slurm_calls.requeue("7", ("node3",), slurm, said.append, sleep=lambda _: None)
    assert [c for c in slurm.calls if c.startswith("scontrol update")] == [
        "scontrol update JobId=7 ExcNodeList=node4,node3",
        "scontrol update JobId=8 ExcNodeList=node3",
    ]
    assert said == [
        "the restarted job's component 0 avoids node(s) node4,node3",
        "the restarted job's component 1 avoids node(s) node3",
    ]


def test_a_heterogeneous_job_pinned_to_a_lost_node_says_it_waits_for_it() -> None:
    """``-N1 -w node3 : -N1 -w node4``, node3 lost: scontrol cannot change the first
    component's ReqNodeList, so it is neither excluded there (it would never start) nor
    dropped; the line says why the job waits; the second component avoids node3."""
    shown = het_job("ReqNodeList=node3 ExcNodeList=node4", "ReqNodeList=node4 ExcNodeList=node3")
    slurm, said = Slurm({**IDLE6, "node3": "down*"}, shown), []
    assert slurm_calls.requeue("7", ("node3",), slurm, said.append, sleep=lambda _: None)
    assert [c for c in slurm.calls if c.startswith("scontrol update")] == [
        "scontrol update JobId=8 ExcNodeList=node3",
    ]
    assert said[0].startswith(
        "the restarted job's component 0 still asks for node(s) node3 by name (sbatch -w)"
    ), said
    assert "HINT: " in said[0]
