"""Rank placement, ports, addresses and TF_CONFIG, from fake Slurm environments."""

from __future__ import annotations

import json
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmtf.cluster import ports
from slurmtf.cluster.layout import ClusterLayout, check_address_template
from slurmtf.cluster.placement import _rounds
from slurmtf.cluster.ports import PortInUseError, derive_port_base, ensure_port_free
from slurmtf.errors import InputError, SlurmtfError
from slurmtf.resolver import resolve
from tests.conftest import FakeSlurmEnv

step_vars = FakeSlurmEnv.step_vars


def nodes_of(nodelist: str, counts: str, dist: str | None = None, plane: int = 2) -> list[str]:
    """The node of every rank, as rank 0 resolves it."""
    env = step_vars(nodelist, counts, 0, distribution=dist, SLURM_DIST_PLANESIZE=plane)
    return list(resolve(env).nodes)


PLACEMENTS = [
    # (nodelist, tasks per node, SLURM_DISTRIBUTION, node of each rank)
    ("n[1-2]", "2(x2)", None, ["n1", "n1", "n2", "n2"]),
    ("n[1-2]", "2(x2)", "block", ["n1", "n1", "n2", "n2"]),
    ("n[1-3]", "2,2,1", "block", ["n1", "n1", "n2", "n2", "n3"]),  # -N3 -n5
    ("n[1-2]", "2(x2)", "cyclic", ["n1", "n2", "n1", "n2"]),
    ("n[1-3]", "2,2,1", "cyclic", ["n1", "n2", "n3", "n1", "n2"]),
    ("n[1-3]", "3,1,2", "cyclic", ["n1", "n2", "n3", "n1", "n3", "n1"]),
    ("n[1-3]", "1,3,1", "cyclic:block", ["n1", "n2", "n3", "n2", "n2"]),
    ("n[1-2]", "2(x2)", "cyclic:cyclic,Pack", ["n1", "n2", "n1", "n2"]),
    ("n[1-2]", "2(x2)", "block:fcyclic", ["n1", "n1", "n2", "n2"]),
    ("n[1-2]", "2(x2)", "*:cyclic", ["n1", "n1", "n2", "n2"]),
    ("n[1-2]", "3,3", "plane", ["n1", "n1", "n2", "n2", "n1", "n2"]),  # SLURM_DIST_PLANESIZE=2
    ("n[1-2]", "3,1", "plane", ["n1", "n1", "n2", "n1"]),
    ("n[1-2]", "4,4", "plane=4", ["n1"] * 4 + ["n2"] * 4),
    ("node[9-10]", "1(x2)", None, ["node9", "node10"]),  # TF sorts node10 first
    ("node10,node9", "1,2", None, ["node10", "node9", "node9"]),  # never sorted
    ("rack[1-2]-n[1-2]", "1(x4)", None, ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("n[1-2]-ib", "1(x2)", None, ["n1-ib", "n2-ib"]),
    ("n[1-2]", "0,2", "cyclic", ["n2", "n2"]),
]


@pytest.mark.parametrize(("nodelist", "counts", "dist", "expected"), PLACEMENTS)
def test_placement(nodelist: str, counts: str, dist: str | None, expected: list[str]) -> None:
    assert nodes_of(nodelist, counts, dist) == expected


def test_arbitrary_distribution_follows_the_hostfile(fake_slurm_env: FakeSlurmEnv) -> None:
    path = fake_slurm_env.hostfile(["n2", "n1", "n2", "n1"])
    env = step_vars("n[1-2]", "2(x2)", 0, distribution="arbitrary", SLURM_HOSTFILE=path)
    fake_slurm_env.set(**env)
    layout = resolve()
    assert list(layout.nodes) == ["n2", "n1", "n2", "n1"]
    assert layout.distribution == "arbitrary"


@pytest.mark.parametrize(
    ("hosts", "problem"),
    [
        (["n1", "n2"], "lists 2 hosts for 4 tasks"),
        (["n1", "n1", "n1", "n2"], "puts 3 tasks on n1"),
        (["n1", "n3", "n2", "n2"], "lists 'n3', not in SLURM_STEP_NODELIST"),
    ],
)
def test_arbitrary_hostfile_must_match_the_step(
    fake_slurm_env: FakeSlurmEnv, hosts: list[str], problem: str
) -> None:
    path = fake_slurm_env.hostfile(hosts)
    fake_slurm_env.step("n[1-2]", "2(x2)", 0, distribution="arbitrary", SLURM_HOSTFILE=path)
    with pytest.raises(InputError, match="SLURM_HOSTFILE") as info:
        resolve()
    assert problem in str(info.value)


@pytest.mark.parametrize(
    ("nodelist", "counts", "dist"),
    [
        ("n[1-4]", "3,1,4,2", "block"),
        ("n[1-4]", "3,1,4,2", "cyclic"),
        ("n[1-4]", "3,1,4,2", "plane"),
        ("node[8-12]", "2(x5)", "cyclic"),
        ("rack[1-2]-n[01-03]", "4(x6)", None),
    ],
)
def test_every_rank_computes_the_identical_worker_list(
    nodelist: str, counts: str, dist: str | None
) -> None:
    base = step_vars(nodelist, counts, 0, distribution=dist, SLURM_DIST_PLANESIZE=3)
    first = resolve(base)
    local_ids = first.local_ids()
    for rank in range(first.num_workers):
        env = dict(
            base,
            SLURM_PROCID=str(rank),
            SLURMD_NODENAME=first.nodes[rank],
            SLURM_LOCALID=str(local_ids[rank]),
        )
        layout = resolve(env)
        assert layout.workers == first.workers
        assert layout.task_index == rank
        assert layout.local_id == local_ids[rank]
        assert layout.is_chief == (rank == 0)
    assert len(set(first.workers)) == first.num_workers


def test_tf_config_and_fields() -> None:
    layout = resolve(step_vars("node[9-10]", "1(x2)", 1, job_id=1234))
    base = 12000 + (1234 % 200) * 100
    assert layout.workers == (f"node9:{base}", f"node10:{base + 1}")
    assert layout.tf_config() == {
        "cluster": {"worker": [f"node9:{base}", f"node10:{base + 1}"]},
        "task": {"type": "worker", "index": 1},
    }
    assert json.loads(layout.tf_config_json()) == layout.tf_config()
    assert "\n" not in layout.tf_config_json()
    assert (layout.num_workers, layout.is_chief, layout.is_single_worker) == (2, False, False)
    assert (layout.address, layout.port, layout.node) == ("node10", base + 1, "node10")
    assert layout.in_slurm
    assert layout.job_id == "1234"
    assert layout.sources == (
        "SLURM_STEP_NODELIST",
        "SLURM_STEP_TASKS_PER_NODE",
        "SLURM_STEP_NUM_TASKS",
    )


def test_job_variables_are_the_fallback() -> None:
    env = {
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_NTASKS": "4",
        "SLURM_PROCID": "3",
    }
    layout = resolve(env)
    assert list(layout.nodes) == ["n1", "n1", "n2", "n2"]
    assert layout.sources == ("SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS")


def test_step_variables_win_over_the_jobs() -> None:
    env = step_vars("n[1-2]", "1(x2)", 1)
    env |= {"SLURM_JOB_NODELIST": "n[1-5]", "SLURM_TASKS_PER_NODE": "4(x5)", "SLURM_NTASKS": "20"}
    assert resolve(env).workers[1].startswith("n2:")


SINGLE = [
    ({}, "not in a Slurm job", False),
    ({"SLURM_JOB_ID": "7"}, "no node list", True),
    (step_vars("n1", "1", 0, job_id=77), "one-task step", True),
]


@pytest.mark.parametrize(("env", "reason", "in_slurm"), SINGLE)
def test_single_local_worker(env: dict[str, str], reason: str, in_slurm: bool) -> None:
    layout = resolve(env)
    assert layout.is_single_worker
    assert layout.num_workers == 1
    assert layout.task_index == 0
    assert layout.address == "localhost"
    assert layout.in_slurm is in_slurm
    assert reason in (layout.single_worker_reason or "")
    assert layout.tf_config()["cluster"] == {"worker": [f"localhost:{layout.port}"]}


def test_outside_slurm_uses_the_default_port() -> None:
    assert resolve({}).port == ports.DEFAULT_PORT
    assert resolve({"SLURMTF_PORT_BASE": "20000"}).port == 20000


BAD_ENVS = [
    # (changes to a 2x2 block step of task 0, variable named, problem)
    ({"SLURM_STEP_NODELIST": "n[3-1]"}, "SLURM_STEP_NODELIST", "reversed range"),
    ({"SLURM_STEP_NODELIST": ""}, "SLURM_STEP_NODELIST", "lists no node"),
    ({"SLURM_STEP_NODELIST": "n1,n1"}, "SLURM_STEP_NODELIST", "twice"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, "SLURM_STEP_TASKS_PER_NODE", "for 3 nodes"),
    ({"SLURM_STEP_TASKS_PER_NODE": None}, "SLURM_STEP_TASKS_PER_NODE", "is not set"),
    ({"SLURM_STEP_TASKS_PER_NODE": "0(x2)"}, "SLURM_STEP_TASKS_PER_NODE", "counts no task"),
    ({"SLURM_STEP_TASKS_PER_NODE": "40000(x2)"}, "SLURM_STEP_TASKS_PER_NODE", "80000 tasks"),
    ({"SLURM_STEP_NUM_TASKS": "5"}, "SLURM_STEP_NUM_TASKS", "does not match"),
    ({"SLURM_STEP_NUM_TASKS": "four"}, "SLURM_STEP_NUM_TASKS", "not a non-negative"),
    ({"SLURM_PROCID": "x"}, "SLURM_PROCID", "not a non-negative"),
    ({"SLURM_PROCID": "-1"}, "SLURM_PROCID", "not a non-negative"),
    ({"SLURM_PROCID": "4"}, "SLURM_PROCID", "not below the number of tasks (4)"),
    ({"SLURM_PROCID": None}, "SLURM_PROCID", "not set"),
    ({"SLURM_DISTRIBUTION": "pack"}, "SLURM_DISTRIBUTION", "'pack'"),
    ({"SLURM_DISTRIBUTION": "plane"}, "SLURM_DIST_PLANESIZE", "not set"),
    ({"SLURM_DISTRIBUTION": "plane=0"}, "SLURM_DIST_PLANESIZE", "is zero"),
    ({"SLURM_DISTRIBUTION": "arbitrary"}, "SLURM_HOSTFILE", "is needed"),
    ({"SLURMD_NODENAME": "n2"}, "SLURMD_NODENAME", "where block places rank 0"),
    ({"SLURM_LOCALID": "1"}, "SLURM_LOCALID", "differs from 0"),
    ({"SLURM_JOB_ID": "12a"}, "SLURM_JOB_ID", "not a non-negative"),
    ({"SLURM_RESTART_COUNT": "x"}, "SLURM_RESTART_COUNT", "not a non-negative"),
    ({"SLURMTF_PORT_BASE": "80"}, "SLURMTF_PORT_BASE", "outside 1024..65535"),
    ({"SLURMTF_PORT_BASE": "http"}, "SLURMTF_PORT_BASE", "not a port number"),
    ({"SLURMTF_PORT_BASE": "65534"}, "SLURMTF_PORT_BASE", "no room for 4 ranks"),
    ({"SLURMTF_ADDRESS_TEMPLATE": "{nope}"}, "SLURMTF_ADDRESS_TEMPLATE", "only {host}"),
    ({"SLURMTF_ADDRESS_TEMPLATE": "ib0"}, "SLURMTF_ADDRESS_TEMPLATE", "does not contain"),
    ({"SLURMTF_ADDRESS_TEMPLATE": "{host"}, "SLURMTF_ADDRESS_TEMPLATE", "not a valid template"),
    ({"SLURMTF_ADDRESS_TEMPLATE": "{host}:1"}, "SLURMTF_ADDRESS_TEMPLATE", "invalid characters"),
    ({"SLURM_STEP_GPUS": "0,;"}, "SLURM_STEP_GPUS", "not a GPU index"),
    ({"SLURM_GPUS_ON_NODE": "two"}, "SLURM_GPUS_ON_NODE", "not a count"),
]


@pytest.mark.parametrize(("changes", "name", "problem"), BAD_ENVS)
def test_bad_input_is_a_clear_error(
    changes: dict[str, str | None], name: str, problem: str
) -> None:
    env = step_vars("n[1-2]", "2(x2)", 0)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    with pytest.raises(InputError) as info:
        resolve(env)
    message = str(info.value)
    assert message.startswith(f"{name}="), message
    assert problem in message, message
    assert "HINT:" in message
    assert "\n" not in message


def test_port_base_and_template_arguments_override_the_environment() -> None:
    env = step_vars("n[1-2]", "1(x2)", 0, SLURMTF_PORT_BASE="20000")
    env["SLURMTF_ADDRESS_TEMPLATE"] = "{host}.eth"
    assert resolve(env).workers == ("n1.eth:20000", "n2.eth:20001")
    layout = resolve(env, port_base=30000, address_template="{host}-ib")
    assert layout.workers == ("n1-ib:30000", "n2-ib:30001")
    assert layout.nodes == ("n1", "n2")
    with pytest.raises(InputError, match=r"^port_base=70000"):
        resolve(env, port_base=70000)


@pytest.mark.parametrize("template", ["{host}", "{host}-ib", "{host}.ib.cluster", "ib-{host}"])
def test_good_address_templates(template: str) -> None:
    check_address_template(template)


# ------------------------------------------------------------------ ports


def test_ports_are_distinct_within_a_job_even_on_one_network_stack() -> None:
    layout = resolve(step_vars("n[1-4]", "8(x4)", 5, job_id=99))
    found = [int(w.rpartition(":")[2]) for w in layout.workers]
    assert found == list(range(layout.port_base, layout.port_base + 32))


@pytest.mark.parametrize("ntasks", [1, 2, 8, 64, 100])
def test_consecutive_jobs_on_the_same_nodes_never_collide(ntasks: int) -> None:
    def used(job_id: int) -> set[int]:
        base = derive_port_base(job_id, ntasks)
        assert base >= ports.WINDOW_LOW
        assert base + ntasks <= ports.WINDOW_HIGH
        return set(range(base, base + ntasks))

    for first in (1, 199, 12345, 2**32 - 300):
        for other in range(first + 1, first + 200):
            assert not used(first) & used(other), (first, other)


@pytest.mark.parametrize("ntasks", [101, 3072, 19999, 20000, 20001, 32768, 64512])
def test_big_jobs_still_fit_the_port_range(ntasks: int) -> None:
    for job_id in (0, 7, 123456):
        base = derive_port_base(job_id, ntasks)
        assert base >= ports.PORT_MIN
        assert base + ntasks - 1 <= ports.PORT_MAX


def test_too_many_tasks_for_distinct_ports() -> None:
    with pytest.raises(InputError, match="distinct ports"):
        derive_port_base(1, 64513)


def test_het_job_id_keys_the_ports() -> None:
    env = step_vars("n[1-2]", "1(x2)", 0, job_id=501, SLURM_HET_JOB_ID=500)
    assert resolve(env).port_base == 12000 + 100 * 100


def test_ensure_port_free_accepts_a_free_port_and_names_a_taken_one() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PortInUseError) as info:
            ensure_port_free(port, "127.0.0.1")
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message
    assert "SLURMTF_PORT_BASE" in message
    assert isinstance(info.value, SlurmtfError)
    ensure_port_free(port, "127.0.0.1")  # released now


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_ensure_port_free_on_all_interfaces_sees_ipv4_and_ipv6_holders(
    family: socket.AddressFamily,
) -> None:
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    with socket.socket(family) as holder:
        holder.bind(("::" if family == socket.AF_INET6 else "", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PortInUseError, match=f":{port} is already in use"):
            ensure_port_free(port)


def test_layout_rejects_inconsistent_values() -> None:
    with pytest.raises(InputError):
        ClusterLayout(workers=("a:1",), nodes=("a",), task_index=1)
    with pytest.raises(InputError):
        ClusterLayout(workers=("a:1",), nodes=())


# ------------------------------------------------------------------ placement property


def _naive_rounds(counts: list[int], size: int) -> list[int]:
    """Slurm's cyclic/plane step layout, one rank at a time."""
    left, ranks = list(counts), []
    while any(left):
        for i, _ in enumerate(counts):
            take = min(size, left[i])
            ranks += [i] * take
            left[i] -= take
    return ranks


@settings(max_examples=200, deadline=None, database=None)
@given(
    counts=st.lists(st.integers(0, 12), min_size=1, max_size=12).filter(any),
    size=st.integers(1, 5),
)
def test_fast_rounds_match_the_naive_layout(counts: list[int], size: int) -> None:
    assert _rounds(counts, size) == _naive_rounds(counts, size)


# ------------------------------------------------------------------ FACTS.md cases


TF_RESOLVER_FAILURES = [
    # Where TensorFlow's SlurmClusterResolver goes wrong; (env changes, node of each rank).
    pytest.param({"SLURM_STEP_NODELIST": "node[9-10]"}, ["node9", "node10"], id="node10-vs-node9"),
    pytest.param(
        {"SLURM_STEP_NODELIST": "rack[1-2]-n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x4)"},
        ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"],
        id="two-bracket-groups",
    ),
    pytest.param({"SLURM_STEP_NODELIST": "n[1-2]-ib"}, ["n1-ib", "n2-ib"], id="suffix"),
    pytest.param(
        {"SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_DISTRIBUTION": "cyclic"},
        ["node1", "node2", "node1", "node2"],
        id="cyclic",
    ),
    pytest.param(
        {
            "SLURM_STEP_NODELIST": None,
            "SLURM_STEP_TASKS_PER_NODE": None,
            "SLURM_STEP_NUM_TASKS": None,
        },
        ["node1", "node2"],
        id="job-variables-only",
    ),
]


@pytest.mark.parametrize(("changes", "expected"), TF_RESOLVER_FAILURES)
def test_cases_where_tensorflows_resolver_fails(
    changes: dict[str, str | None], expected: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = step_vars("node[1-2]", "1(x2)", 0, job_id=77)
    for key, value in changes.items():
        if value is None:
            env.pop(key)
        else:
            env[key] = value
    for name in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
        if name in env:
            env[name] = str(len(expected))

    def no_subprocess(*args: object, **kwargs: object) -> None:
        raise AssertionError("the resolver must not run a command (nvidia-smi, scontrol)")

    monkeypatch.setattr("subprocess.Popen.__init__", no_subprocess)
    monkeypatch.setattr("os.posix_spawn", no_subprocess)
    for rank, node in enumerate(expected):
        layout = resolve(dict(env, SLURM_PROCID=str(rank), SLURMD_NODENAME=node))
        assert list(layout.nodes) == expected
        assert layout.address == node
        assert layout.task_index == rank


def test_reversed_range_is_an_error_not_an_empty_cluster() -> None:
    with pytest.raises(InputError, match=r"^SLURM_STEP_NODELIST='n\[3-1\]': has the reversed"):
        resolve(step_vars("n[3-1]", "1(x3)", 0))


@settings(max_examples=100, deadline=None, database=None)
@given(
    counts=st.lists(st.integers(1, 6), min_size=1, max_size=6),
    dist=st.sampled_from(["block", "cyclic", "plane"]),
    plane=st.integers(1, 4),
    job_id=st.integers(0, 2**32 - 1),
)
def test_every_rank_agrees_and_slurms_local_ids_hold(
    counts: list[int], dist: str, plane: int, job_id: int
) -> None:
    text = ",".join(map(str, counts))
    base = step_vars(
        f"node[1-{len(counts)}]", text, 0, job_id=job_id, distribution=dist,
        SLURM_DIST_PLANESIZE=plane,
    )  # fmt: skip
    first = resolve(base)
    per_node = {f"node{i + 1}": count for i, count in enumerate(counts)}
    assert {n: first.nodes.count(n) for n in per_node} == per_node
    for rank, (node, local_id) in enumerate(zip(first.nodes, first.local_ids(), strict=True)):
        env = dict(base, SLURM_PROCID=str(rank), SLURMD_NODENAME=node, SLURM_LOCALID=str(local_id))
        layout = resolve(env)
        assert layout.workers == first.workers
        assert layout.local_tasks == per_node[node]
    assert len(set(first.workers)) == len(first.workers)
