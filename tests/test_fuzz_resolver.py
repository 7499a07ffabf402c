"""Fuzzing the resolver: generated Slurm environments in, a correct layout or a clear error out.

Two properties, each run for ``SLURMTF_FUZZ_EXAMPLES`` generated environments
(default 1,500 per property, about 20 s in CI on 2 cores; each run draws new ones):

* environments built from a known allocation (hosts, tasks per node, distribution,
  rank) must resolve to exactly the placement Slurm makes, computed here independently;
* hostile environments (mutated, truncated, dropped or garbage variables) must give a
  layout that is internally consistent, or a ``SlurmtfError`` whose message names a
  variable and carries a ``HINT:``. Any other exception type is a bug.

The full count (documented in docs/FAILURES.md)::

    SLURMTF_FUZZ_EXAMPLES=100000 python3 -m pytest tests/test_fuzz_resolver.py \
        -p no:cacheprovider --hypothesis-show-statistics
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import resource
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from slurmtf import resolver
from slurmtf.errors import SlurmtfError

EXAMPLES = int(os.environ.get("SLURMTF_FUZZ_EXAMPLES", "1500"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
    # The explain phase imports modules that warn on import, which pytest turns into errors.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    print_blob=True,
)

# Every variable the resolver may read; an error message must name one of them.
STEP_VARS = ("SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS")
JOB_VARS = ("SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS")
RANK_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURMD_NODENAME")
OTHER_VARS = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_HET_JOB_ID",
    "SLURM_HET_JOB_OFFSET",
    "SLURM_DISTRIBUTION",
    "SLURM_DIST_PLANESIZE",
    "SLURM_HOSTFILE",
    "SLURM_NNODES",
    "SLURM_JOB_NUM_NODES",
    "SLURM_STEP_NUM_NODES",
    "SLURM_STEP_GPUS",
    "SLURM_GPUS_ON_NODE",
    "SLURM_JOB_GPUS",
    "CUDA_VISIBLE_DEVICES",
    "SLURM_RESTART_COUNT",
    "SLURMTF_PORT_BASE",
    "SLURMTF_ADDRESS_TEMPLATE",
    "SLURMTF_JOBS",
    "SLURM_HET_SIZE",
    "SLURM_JOB_NODELIST_HET_GROUP_0",
    "SLURM_JOB_NODELIST_HET_GROUP_1",
)
ALL_VARS = STEP_VARS + JOB_VARS + RANK_VARS + OTHER_VARS
_VAR_NAME = re.compile(r"\b(SLURM[A-Z0-9_]*|CUDA_VISIBLE_DEVICES|port_base|address_template)\b")

_HOSTFILES = Path(tempfile.mkdtemp(prefix="slurmtf-fuzz-"))


@contextlib.contextmanager
def memory_limit(extra: int) -> Iterator[None]:
    """Cap this process's address space at its current size plus ``extra`` bytes, so
    that a memory bomb in the code under test raises MemoryError instead of taking the
    machine down."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with Path("/proc/self/statm").open() as statm:
        used = int(statm.read().split()[0]) * resource.getpagesize()
    limit = used + extra if hard == resource.RLIM_INFINITY else min(used + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture(autouse=True, scope="module")
def _memory_guard() -> Iterator[None]:
    with memory_limit(2 * 1024**3):
        yield


# ---------------------------------------------------------------- allocations


@dataclass(frozen=True)
class Allocation:
    """A Slurm allocation as Slurm knows it, and the environment a rank of it sees."""

    env: dict[str, str]
    hosts: tuple[str, ...]  # node order as Slurm lists it
    ranks: tuple[str, ...]  # node of every rank, index = SLURM_PROCID
    procid: int


_name_start = st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_name_rest = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_.", max_size=6)


@st.composite
def _word(draw: st.DrawFn) -> str:
    """A host-name piece that does not end in a digit (so padding stays unambiguous)."""
    word = draw(_name_start) + draw(_name_rest)
    return word.rstrip("0123456789.-_") or "n"


@st.composite
def _numbers(draw: st.DrawFn) -> tuple[tuple[int, ...], int]:
    """Distinct node numbers in Slurm's (not necessarily sorted) order, and a pad width."""
    width = draw(st.sampled_from([0, 0, 1, 2, 3, 4]))
    top = 10**width - 1 if width else 10_000
    nums = draw(st.lists(st.integers(0, min(top, 300)), min_size=1, max_size=6, unique=True))
    if draw(st.booleans()):
        nums.sort()
    return tuple(nums), width


def _rangelist(nums: tuple[int, ...], width: int) -> str:
    """``[1-3,7]``-style text for numbers, merging ascending runs into ranges."""
    items: list[str] = []
    run: list[int] = [nums[0]]
    for n in nums[1:]:
        if n == run[-1] + 1:
            run.append(n)
            continue
        items.append(_run_text(run, width))
        run = [n]
    items.append(_run_text(run, width))
    return "[" + ",".join(items) + "]"


def _run_text(run: list[int], width: int) -> str:
    if len(run) == 1:
        return f"{run[0]:0{width}d}"
    return f"{run[0]:0{width}d}-{run[-1]:0{width}d}"


@st.composite
def _host_group(draw: st.DrawFn) -> tuple[list[str], str]:
    """One comma item of a hostlist: its hosts in order, and its text (bracketed or not)."""
    kind = draw(st.sampled_from(["plain", "fqdn", "bracket", "bracket", "two", "suffix"]))
    if kind in {"plain", "fqdn"}:
        host = draw(_word()) + str(draw(st.integers(0, 999)))
        if kind == "fqdn":
            host += "." + draw(_word()) + ".example.org"
        return [host], host
    prefix = draw(_word())
    nums, width = draw(_numbers())
    if kind == "two":  # rack[1-2]-n[1-2]: the leftmost bracket varies slowest
        mid = "-" + draw(_word())
        nums2, width2 = draw(_numbers())
        hosts = [
            f"{prefix}{a:0{width}d}{mid}{b:0{width2}d}" for a, b in itertools.product(nums, nums2)
        ]
        return hosts, f"{prefix}{_rangelist(nums, width)}{mid}{_rangelist(nums2, width2)}"
    suffix = draw(st.sampled_from(["-ib", ".cluster", "-gpu"])) if kind == "suffix" else ""
    hosts = [f"{prefix}{n:0{width}d}{suffix}" for n in nums]
    return hosts, f"{prefix}{_rangelist(nums, width)}{suffix}"


@st.composite
def hostlists(draw: st.DrawFn) -> tuple[list[str], str]:
    """Distinct hosts in Slurm's order and a hostlist expression that expands to them."""
    groups = draw(st.lists(_host_group(), min_size=1, max_size=4))
    hosts = [h for group, _ in groups for h in group]
    if len(set(hosts)) != len(hosts) or len(hosts) > 48:
        # Slurm never lists a node twice; rebuild as plain distinct names.
        hosts = list(dict.fromkeys(hosts))[:48]
        return hosts, ",".join(hosts)
    return hosts, ",".join(text for _, text in groups)


def tasks_per_node_text(counts: list[int], compress: bool) -> str:
    """Slurm's ``2(x3),1`` form (or the plain comma list when not compressing)."""
    if not compress:
        return ",".join(str(c) for c in counts)
    parts = []
    for count, run in itertools.groupby(counts):
        k = len(list(run))
        parts.append(f"{count}(x{k})" if k > 1 else str(count))
    return ",".join(parts)


def place(hosts: list[str], counts: list[int], dist: str, plane: int) -> list[str]:
    """The node of each rank, as Slurm's step layout places them (slurm_step_layout.c)."""
    ntasks = sum(counts)
    slots: list[list[int]] = [[] for _ in hosts]
    rank = 0
    if dist == "block":
        for i, c in enumerate(counts):
            slots[i] = list(range(rank, rank + c))
            rank += c
    else:
        block = plane if dist == "plane" else 1
        while rank < ntasks:
            for i, c in enumerate(counts):
                take = min(block, c - len(slots[i]), ntasks - rank)
                slots[i].extend(range(rank, rank + take))
                rank += take
    nodes = [""] * ntasks
    for i, ranks in enumerate(slots):
        for r in ranks:
            nodes[r] = hosts[i]
    return nodes


def _hostfile(ranks: list[str]) -> str:
    path = _HOSTFILES / f"hosts-{abs(hash(tuple(ranks)))}"
    if not path.exists():
        path.write_text("".join(f"{h}\n" for h in ranks))
    return str(path)


_COUNT = st.sampled_from([1, 1, 1, 2, 2, 3, 4, 8]) | st.integers(1, 64)


@st.composite
def allocations(draw: st.DrawFn) -> Allocation:  # noqa: C901 - draws every step variable
    hosts, nodelist = draw(hostlists())
    # Runs of equal counts, repeated to cover every host: Slurm's own `2(x3),1` shapes.
    runs = draw(st.lists(st.tuples(_COUNT, st.integers(1, 16)), min_size=1, max_size=3))
    pattern = [count for count, repeat in runs for _ in range(repeat)]
    counts = (pattern * (len(hosts) // len(pattern) + 1))[: len(hosts)]
    dist = draw(st.sampled_from(["", "block", "cyclic", "plane", "arbitrary"]))
    plane = draw(st.integers(1, 8))
    ranks = place(hosts, counts, dist or "block", plane)
    if dist == "arbitrary":
        ranks = draw(st.permutations(ranks))
    ntasks = len(ranks)
    procid = draw(st.integers(0, ntasks - 1))
    tpn = tasks_per_node_text(counts, compress=draw(st.booleans()))
    step = draw(st.sampled_from(["step", "job", "both"]))
    env: dict[str, str] = {"SLURM_PROCID": str(procid)}
    if step in {"step", "both"}:
        env |= {"SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": tpn}
        if draw(st.integers(0, 4)):
            env["SLURM_STEP_NUM_TASKS"] = str(ntasks)
    if step == "job":
        env |= {"SLURM_JOB_NODELIST": nodelist, "SLURM_TASKS_PER_NODE": tpn}
        if draw(st.integers(0, 4)):
            env["SLURM_NTASKS"] = str(ntasks)
    if step == "both":  # the job is bigger than the step; the step must win
        extra = draw(st.sampled_from(["spare[1-3]", "spare7"]))
        env |= {
            "SLURM_JOB_NODELIST": f"{nodelist},{extra}",
            "SLURM_TASKS_PER_NODE": f"{tpn},{draw(st.integers(1, 9))}",
            "SLURM_NTASKS": str(ntasks + 5),
        }
    if dist:
        head = "plane" if dist == "plane" else dist
        tail = draw(st.sampled_from(["", ":block", ":cyclic", ":fcyclic"]))
        env["SLURM_DISTRIBUTION"] = head + tail
    if dist == "plane":
        env["SLURM_DIST_PLANESIZE"] = str(plane)
    if dist == "arbitrary":
        env["SLURM_HOSTFILE"] = _hostfile(list(ranks))
    me = ranks[procid]
    if draw(st.booleans()):
        env["SLURMD_NODENAME"] = me
        env["SLURM_NODEID"] = str(hosts.index(me))
        env["SLURM_LOCALID"] = str(sum(1 for r in ranks[:procid] if r == me))
    if draw(st.integers(0, 5)):
        env["SLURM_JOB_ID"] = str(draw(st.integers(1, 2**32 - 1)))
    if draw(st.integers(0, 3)) == 0:
        env["SLURM_ARRAY_JOB_ID"] = env.get("SLURM_JOB_ID", "1")
        env["SLURM_ARRAY_TASK_ID"] = str(draw(st.integers(0, 10_000)))
    return Allocation(env=env, hosts=tuple(hosts), ranks=tuple(ranks), procid=procid)


# ---------------------------------------------------------------- checks


def _port(worker: str) -> int:
    host, _, port = worker.rpartition(":")
    assert host, worker
    return int(port)


def check_consistent(layout: Any) -> None:
    """What every layout must satisfy, whatever the input was."""
    workers = list(layout.workers)
    assert layout.num_workers == len(workers) >= 1
    assert 0 <= layout.task_index < layout.num_workers
    if layout.roles is None:
        assert layout.is_chief == (layout.task_index == 0)
    else:  # every rank in the cluster once, under its role; this task where it says
        assert len(layout.roles) == len(workers)
        cluster = layout.cluster()
        assert sorted(a for addresses in cluster.values() for a in addresses) == sorted(workers)
        assert cluster[layout.task_type][layout.task_id] == workers[layout.task_index]
    assert layout.is_single_worker == (layout.num_workers == 1)
    assert len(set(workers)) == len(workers), workers
    ports = [_port(w) for w in workers]
    assert all(1 <= p <= 65535 for p in ports), ports
    assert len(set(ports)) == len(ports), f"two ranks share a port: {workers}"
    assert len(layout.nodes) == len(workers)
    assert layout.port == ports[layout.task_index]
    config = layout.tf_config()
    if layout.roles is not None:
        assert config["task"] == {"type": layout.task_type, "index": layout.task_id}
    elif not layout.is_single_worker:
        assert config == {
            "cluster": {"worker": workers},
            "task": {"type": "worker", "index": layout.task_index},
        }
    assert json.loads(layout.tf_config_json()) == config


def check_error(exc: SlurmtfError) -> None:
    message = str(exc)
    assert "HINT:" in message, message
    assert _VAR_NAME.search(message), f"no variable named in: {message}"
    assert "\n" not in message.strip() or len(message) < 2000, message


def _resolve(env: Mapping[str, str]) -> Any:
    return resolver.resolve(environ=dict(env))


# ---------------------------------------------------------------- properties


@pytest.mark.slow
@FUZZ
@given(alloc=allocations(), other=st.integers(0, 10**6))
def test_known_allocations_resolve_to_slurms_placement(alloc: Allocation, other: int) -> None:
    layout = _resolve(alloc.env)
    check_consistent(layout)
    assert layout.num_workers == len(alloc.ranks)
    assert layout.task_index == alloc.procid
    if layout.is_single_worker:
        return
    assert list(layout.nodes) == list(alloc.ranks), alloc.env
    assert [w.rpartition(":")[0] for w in layout.workers] == list(alloc.ranks)
    # Every rank of the job computes the identical worker list.
    peer = other % len(alloc.ranks)
    env = dict(alloc.env, SLURM_PROCID=str(peer))
    for key in ("SLURMD_NODENAME", "SLURM_NODEID", "SLURM_LOCALID"):
        env.pop(key, None)
    peer_layout = _resolve(env)
    assert list(peer_layout.workers) == list(layout.workers)
    assert peer_layout.task_index == peer


_HOSTILE_CHARS = "[]-,()x0123456789 \t\n.:_%{}$;'\"\\*+#@/\x00\u00e9\u0663"
_GARBAGE = st.sampled_from(
    [
        "",
        " ",
        "-1",
        "0",
        "1.5",
        "+1",
        " 1",
        "1_000",
        "0x10",
        "\u0661",  # ARABIC-INDIC DIGIT ONE: int() accepts it, Slurm never writes it
        "99999999999999999999999",
        "n[1-",
        "n[3-1]",
        "n[]",
        "n[1-2-3]",
        "n[a-c]",
        "n[[1]]",
        "n[1-99999999]",
        "n[1-3],n2",
        "n[01-3]",
        "n,,m",
        ",",
        "2(x)",
        "(x3)",
        "2(x3",
        "0(x2)",
        "-1(x2)",
        "3(x0)",
        "1000000000(x1000000000)",
        "4294967296",
        "block:",
        ":cyclic",
        "plane=3",
        "arbitrary",
        "pack",
        "/nonexistent/hostfile",
        "/",
        "{host",
        "{nope}",
        "{host}{host}",
        "%s",
        "$(touch /tmp/slurmtf-pwned)",
    ]
) | st.text(_HOSTILE_CHARS, max_size=12)


def _binary_hostfile() -> str:
    path = _HOSTFILES / "binary"
    if not path.exists():
        path.write_bytes(b"\xff\xfe\x00garbage\n\x80\x81")
    return str(path)


_JOBS = ["chief:1,ps:1,worker", "worker", "chief:1,worker", "worker:1,evaluator",
         "chief:1@0,ps@0,worker@1", "worker@0,worker@1", "ps:0", "chief:1,ps"]  # fmt: skip


def _roles_and_components(draw: st.DrawFn, hosts: tuple[str, ...]) -> dict[str, str]:
    """Sometimes roles (valid or not), sometimes two het components over the hosts."""
    env = {}
    if draw(st.integers(0, 3)) == 0:
        env["SLURMTF_JOBS"] = draw(st.sampled_from(_JOBS) | _GARBAGE)
    if draw(st.integers(0, 3)) == 0:
        cut = draw(st.integers(0, len(hosts)))
        env["SLURM_HET_SIZE"] = "2"
        env["SLURM_JOB_NODELIST_HET_GROUP_0"] = ",".join(hosts[:cut])
        env["SLURM_JOB_NODELIST_HET_GROUP_1"] = ",".join(hosts[cut:])
    return env


@st.composite
def hostile_envs(draw: st.DrawFn) -> dict[str, str]:
    allocation = draw(allocations())
    env = dict(allocation.env) | _roles_and_components(draw, allocation.hosts)
    if draw(st.integers(0, 3)) == 0:
        env["SLURMTF_PORT_BASE"] = draw(_GARBAGE | st.integers(-10, 70_000).map(str))
    if draw(st.integers(0, 3)) == 0:
        env["SLURMTF_ADDRESS_TEMPLATE"] = draw(
            st.sampled_from(["{host}-ib", "{host}.ib.example", "{host}"]) | _GARBAGE
        )
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(ALL_VARS))
        action = draw(st.sampled_from(["drop", "garbage", "mutate", "mutate", "duplicate"]))
        value = env.get(key, "")
        if action == "drop":
            env.pop(key, None)
        elif action == "garbage":
            env[key] = draw(_GARBAGE)
        elif action == "duplicate":
            env[key] = f"{value},{value}" if value else "1"
        else:  # insert, delete or replace one character
            pos = draw(st.integers(0, len(value)))
            char = draw(st.sampled_from(_HOSTILE_CHARS))
            how = draw(st.sampled_from(["insert", "delete", "replace"]))
            if how == "insert":
                env[key] = value[:pos] + char + value[pos:]
            elif how == "delete":
                env[key] = value[:pos] + value[pos + 1 :]
            else:
                env[key] = value[:pos] + char + value[pos + 1 :]
    if draw(st.integers(0, 30)) == 0:
        env["SLURM_DISTRIBUTION"] = "arbitrary"
        env["SLURM_HOSTFILE"] = draw(
            st.sampled_from(
                ["/nonexistent/hostfile", "/", _binary_hostfile(), "/dev/null", "/tmp/h\x00"]
            )
        )
    return env


def _outcome(env: dict[str, str]) -> Iterator[Any]:
    try:
        layout = _resolve(env)
    except SlurmtfError as exc:
        check_error(exc)
        return
    yield layout


@pytest.mark.slow
@FUZZ
@given(env=hostile_envs())
def test_hostile_environments_give_a_layout_or_a_clear_error(env: dict[str, str]) -> None:
    for layout in _outcome(env):
        check_consistent(layout)
        step = "SLURM_STEP_NODELIST" in env
        ntasks = env.get("SLURM_STEP_NUM_TASKS" if step else "SLURM_NTASKS") or ""
        if ntasks.isascii() and ntasks.isdigit() and not layout.is_single_worker:
            assert layout.num_workers == int(ntasks), (env, layout.workers)
        procid = env.get("SLURM_PROCID", "")
        if procid.isascii() and procid.isdigit() and not layout.is_single_worker:
            assert layout.task_index == int(procid)


@pytest.mark.slow
@FUZZ
@given(env=st.dictionaries(st.sampled_from(ALL_VARS), _GARBAGE, max_size=8))
def test_random_variable_soup_never_crashes(env: dict[str, str]) -> None:
    for layout in _outcome(env):
        check_consistent(layout)


def test_a_huge_gpu_count_is_an_error_not_a_memory_bomb() -> None:
    env = {"SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_PROCID": "0"}
    with memory_limit(256 * 1024**2), pytest.raises(SlurmtfError) as info:
        _resolve(env | {"SLURM_GPUS_ON_NODE": "99999999999"})
    check_error(info.value)


def test_a_nul_in_the_hostfile_path_is_an_error_naming_it() -> None:
    env = {
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_PROCID": "0",
        "SLURM_DISTRIBUTION": "arbitrary",
        "SLURM_HOSTFILE": "/tmp/hosts\x00",
    }
    with pytest.raises(SlurmtfError) as info:
        _resolve(env)
    check_error(info.value)
