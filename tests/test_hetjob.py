"""Heterogeneous job steps (``srun --het-group=0,1``) from fake environments.

The shapes are those measured on Slurm 22.05 (docs/RESOLVER.md): the step's node list
is merged and sorted, its task counts follow that list, while ranks go component by
component, each over its own nodes (``SLURM_JOB_NODELIST_HET_GROUP_N``).
"""

from __future__ import annotations

import json

import pytest

from slurmtf.cluster import step_flags
from slurmtf.cluster.env import read_slurm_env
from slurmtf.cluster.layout import ClusterLayout
from slurmtf.errors import InputError
from slurmtf.resolver import explain, resolve

JOB_ID = "628190"


def het_env(
    step_nodes: str, counts: str, groups: list[str], rank: int, dist: str | None = "block",
    **extra: str,
) -> dict[str, str]:  # fmt: skip
    """What rank ``rank`` of a step over a heterogeneous job sees (no SLURMD_NODENAME)."""
    env = {
        "SLURM_STEP_NODELIST": step_nodes,
        "SLURM_STEP_TASKS_PER_NODE": counts,
        "SLURM_JOB_NODELIST": step_nodes,
        "SLURM_PROCID": str(rank),
        "SLURM_JOB_ID": JOB_ID,
        "SLURM_HET_SIZE": str(len(groups)),
    }
    for k, nodelist in enumerate(groups):
        env[f"SLURM_JOB_NODELIST_HET_GROUP_{k}"] = nodelist
        env[f"SLURM_JOB_ID_HET_GROUP_{k}"] = str(int(JOB_ID) + k)
    if dist is not None:
        env["SLURM_DISTRIBUTION"] = dist
    return env | extra


def local_ids(nodes: list[str]) -> list[int]:
    return [nodes[:rank].count(node) for rank, node in enumerate(nodes)]


SHAPES = [
    # (step nodes, SLURM_STEP_TASKS_PER_NODE, component node lists, distribution,
    #  node of each rank, component of each rank), as srun set and placed them
    pytest.param(
        "node[1-3]", "2,1(x2)", ["node1", "node[2-3]"], "cyclic",
        ["node1", "node1", "node2", "node3"], [0, 0, 1, 1], id="N1n2+N2n1",
    ),
    pytest.param(
        "node[1-3]", "2,1(x2)", ["node1", "node[2-3]"], "block",
        ["node1", "node1", "node2", "node3"], [0, 0, 1, 1], id="N1n2+N2n1-block",
    ),
    pytest.param(
        "node[1-3]", "2(x3)", ["node3", "node[1-2]"], "block",
        ["node3", "node3", "node1", "node1", "node2", "node2"], [0, 0, 1, 1, 1, 1],
        id="component0-on-node3",
    ),
    pytest.param(
        "node[1-3]", "2(x3)", ["node3", "node[1-2]"], "cyclic",
        ["node3", "node3", "node1", "node2", "node1", "node2"], [0, 0, 1, 1, 1, 1],
        id="component0-on-node3-cyclic",
    ),
    pytest.param(
        "node[1-3]", "2,1(x2)", ["node3", "node[1-2]"], "block",
        ["node3", "node1", "node1", "node2"], [0, 1, 1, 1], id="colon-n1:n3",
    ),
    pytest.param(
        "node[1-3]", "2(x2),1", ["node3", "node[1-2]"], "cyclic",
        ["node3", "node1", "node2", "node1", "node2"], [0, 1, 1, 1, 1], id="colon-n1:n4-cyclic",
    ),
    pytest.param(
        "node[2-3]", "2(x2)", ["node1", "node[2-3]"], "block",
        ["node2", "node2", "node3", "node3"], [1, 1, 1, 1], id="het-group-1-only",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("step_nodes", "counts", "groups", "dist", "nodes", "components"), SHAPES)
def test_every_rank_places_the_het_step_as_slurm_did(  # noqa: PLR0917
    step_nodes: str,
    counts: str,
    groups: list[str],
    dist: str,
    nodes: list[str],
    components: list[int],
) -> None:
    """Each rank, with the node and local id Slurm gave it, resolves the same layout."""
    layouts = []
    for rank, (node, local) in enumerate(zip(nodes, local_ids(nodes), strict=True)):
        env = het_env(
            step_nodes, counts, groups, rank, dist,
            SLURMD_NODENAME=node, SLURM_LOCALID=str(local),
        )  # fmt: skip
        layouts.append(resolve(env))
    first = layouts[0]
    assert list(first.nodes) == nodes
    assert list(first.components or ()) == components
    assert all(layout.workers == first.workers for layout in layouts)
    assert len(set(first.workers)) == len(nodes)  # one port per rank on a shared host
    assert [layout.component for layout in layouts] == components


def test_the_old_placement_fails_on_the_issue_shape() -> None:
    """Without the component lists, cyclic over the merged list puts rank 2 on node3."""
    env = het_env("node[1-3]", "2,1(x2)", ["node1", "node[2-3]"], 2, "cyclic")
    env |= {"SLURMD_NODENAME": "node2"}
    assert resolve(env).node == "node2"
    del env["SLURM_HET_SIZE"]
    with pytest.raises(InputError, match="SLURMD_NODENAME='node2': differs from 'node3'"):
        resolve(env)


ROLE_SHAPES = [
    # (SLURMTF_JOBS, shape index in SHAPES, type:index of each rank)
    ("chief@0,ps:1@1,worker@1", 4, ["chief:0", "ps:0", "worker:0", "worker:1"]),
    ("chief:1@0,ps@0,worker@1", 2, ["chief:0", "ps:0"] + [f"worker:{i}" for i in range(4)]),
    ("chief:1@0,ps@0,worker:1@1,evaluator@1", 0, ["chief:0", "ps:0", "worker:0", "evaluator:0"]),
    ("chief:1,ps:1,worker", 4, ["chief:0", "ps:0", "worker:0", "worker:1"]),  # over all ranks
    ("chief:1@0,ps@0,worker@1", 6, ["worker:0", "worker:1", "worker:2", "worker:3"]),
]  # fmt: skip


@pytest.mark.parametrize(("jobs", "shape", "expected"), ROLE_SHAPES)
def test_roles_follow_components(jobs: str, shape: int, expected: list[str]) -> None:
    step_nodes, counts, groups, dist, nodes, _ = SHAPES[shape].values
    tf_configs = []
    for rank, node in enumerate(nodes):  # type: ignore[arg-type]
        env = het_env(step_nodes, counts, groups, rank, dist, SLURMD_NODENAME=node)  # type: ignore[arg-type]
        layout = resolve({**env, "SLURMTF_JOBS": jobs})
        tf_configs.append(layout.tf_config())
        assert f"{layout.task_type}:{layout.task_id}" == expected[rank]
    assert len({json.dumps(c["cluster"]) for c in tf_configs}) == 1


BAD_HET = [
    # (change to the issue shape's rank 0 environment, variable named, words of the message)
    ({"SLURM_HET_SIZE": "two"}, "SLURM_HET_SIZE", "is not a component count"),
    ({"SLURM_HET_SIZE": "0"}, "SLURM_HET_SIZE", "is not a component count"),
    ({"SLURM_JOB_NODELIST_HET_GROUP_1": None}, "SLURM_JOB_NODELIST_HET_GROUP_1", "is not set"),
    (
        {"SLURM_JOB_NODELIST_HET_GROUP_1": "node[1-3]"},
        "SLURM_JOB_NODELIST_HET_GROUP_1",
        "shares node 'node1' with component 0",
    ),
    ({"SLURM_JOB_NODELIST_HET_GROUP_1": "node2"}, "SLURM_STEP_NODELIST", "lists 'node3', which no"),
    (
        {"SLURM_JOB_NODELIST_HET_GROUP_1": "node2,node2,node3"},
        "SLURM_JOB_NODELIST_HET_GROUP_1",
        "lists node 'node2' twice",
    ),
    (
        {"SLURMTF_JOBS": "chief:1@0,ps@0,worker@2"},
        "SLURMTF_JOBS",
        "names component 2 but the job has 2",
    ),
    ({"SLURMTF_JOBS": "chief:1@0,ps@0"}, "SLURMTF_JOBS", "gives no role to the 2 task(s) of comp"),
    (
        {"SLURMTF_JOBS": "chief:1@0,ps:3@0,worker@1"},
        "SLURMTF_JOBS",
        "asks for 4 task(s) but component 0 of the step has 2",
    ),
    ({"SLURMTF_JOBS": "worker:1@1,evaluator:1@1,ps:1@1"}, "SLURMTF_JOBS", "has ps tasks but no"),
    ({"SLURMD_NODENAME": "node2"}, "SLURMD_NODENAME", "within component 0 of the het job"),
]


@pytest.mark.parametrize(("change", "name", "problem"), BAD_HET)
def test_bad_het_input_is_one_line(change: dict[str, str | None], name: str, problem: str) -> None:
    env = het_env("node[1-3]", "2,1(x2)", ["node1", "node[2-3]"], 0, "cyclic")
    env = {k: v for k, v in (env | change).items() if v is not None}  # type: ignore[operator]
    with pytest.raises(InputError) as info:
        resolve(env)
    message = str(info.value)
    assert message.startswith(f"{name}="), message
    assert problem in message
    assert "HINT: " in message


def test_old_pack_group_names_are_read() -> None:
    env = het_env("node[1-3]", "2,1(x2)", ["node1", "node[2-3]"], 3, "cyclic")
    old = {k.replace("HET_GROUP", "PACK_GROUP").replace("HET_SIZE", "PACK_SIZE"): v
           for k, v in env.items()}  # fmt: skip
    assert read_slurm_env(old).het_nodelists == ("node1", "node[2-3]")
    assert resolve(old).nodes == resolve(env).nodes == ("node1", "node1", "node2", "node3")


def test_every_component_derives_the_same_ports() -> None:
    """Ports come from the het job's first id even where a component sees its own id."""
    env = het_env("node[1-3]", "2,1(x2)", ["node1", "node[2-3]"], 0, "cyclic")
    own_id = {**env, "SLURM_PROCID": "3", "SLURM_JOB_ID": str(int(JOB_ID) + 1)}
    assert resolve(env).workers == resolve(own_id).workers


def test_explain_shows_components() -> None:
    env = het_env("node[1-3]", "2,1(x2)", ["node1", "node[2-3]"], 2, "cyclic")
    text = explain(resolve({**env, "SLURMTF_JOBS": "chief:1@0,ps@0,worker@1"}))
    assert "1 chief, 1 ps, 2 workers on 3 nodes of 2 het components" in text
    assert [line.split()[-6] for line in text.splitlines()[2:6]] == [
        "chief:0@0", "ps:0@0", "worker:0@1", "worker:1@1"
    ]  # fmt: skip


def test_layout_checks_components_length() -> None:
    with pytest.raises(InputError, match="components"):
        ClusterLayout(workers=("a:1", "b:2"), nodes=("a", "b"), components=(0,))


def test_a_step_of_one_component_is_laid_out_over_its_nodes_only() -> None:
    """``srun --het-group=1``: the step's variables are component 1's; roles may name it."""
    env = het_env("node[2-3]", "2(x2)", ["node1", "node[2-3]"], 3, "block", SLURMD_NODENAME="node3")
    layout = resolve({**env, "SLURMTF_JOBS": "chief:1@0,ps@0,worker@1"})
    assert layout.cluster() == {"worker": [f"node{n}:{layout.port_base + i}"
                                           for i, n in enumerate((2, 2, 3, 3))]}  # fmt: skip
    assert (layout.task_type, layout.task_id, layout.component) == ("worker", 3, 1)
    assert "4 workers on 2 nodes of 1 het component," in explain(layout)


# The batch environment of `sbatch -N1 -n2 : -N1 --ntasks-per-node=1` on Slurm 26.05.3:
# component 1 has no SLURM_NTASKS_HET_GROUP_1 (and srun --het-group gave it component
# 0's SLURM_NTASKS=2: "More processors requested than permitted").
HET_BATCH_26_05 = {
    "SLURM_HET_SIZE": "2",
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_HET_GROUP_0": "2",
    "SLURM_NTASKS_PER_NODE_HET_GROUP_1": "1",
    "SLURM_TASKS_PER_NODE_HET_GROUP_0": "2",
    "SLURM_TASKS_PER_NODE_HET_GROUP_1": "1",
}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (HET_BATCH_26_05, {"SLURM_NTASKS_HET_GROUP_1": "1"}),
        ({**HET_BATCH_26_05, "SLURM_TASKS_PER_NODE_HET_GROUP_1": "2(x3),1"},
         {"SLURM_NTASKS_HET_GROUP_1": "7"}),
        ({**HET_BATCH_26_05, "SLURM_NTASKS_HET_GROUP_1": "1"}, {}),  # 22.05 set it
        ({"SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "2(x2)"}, {}),  # not heterogeneous
        ({**HET_BATCH_26_05, "SLURM_HET_SIZE": "1"}, {}),
    ],
)  # fmt: skip
def test_each_component_gets_its_own_task_count(
    environ: dict[str, str], expected: dict[str, str]
) -> None:
    assert step_flags.het_task_counts(environ) == expected


def test_a_bad_component_count_names_its_variable() -> None:
    bad = {**HET_BATCH_26_05, "SLURM_TASKS_PER_NODE_HET_GROUP_1": "two"}
    with pytest.raises(InputError, match="SLURM_TASKS_PER_NODE_HET_GROUP_1='two'"):
        step_flags.het_task_counts(bad)
