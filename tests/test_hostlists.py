"""Hostlist expansion and task counts: Slurm's grammar and order, clear errors."""

from __future__ import annotations

import pytest

from slurmtf.cluster.hostlists import MAX_HOSTS, expand_hostlist, parse_task_counts
from slurmtf.errors import InputError

EXPANSIONS = [
    ("node1", ["node1"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("node[9-11]", ["node9", "node10", "node11"]),  # numeric, not string, order
    ("node10,node9", ["node10", "node9"]),  # Slurm's order is kept, never sorted
    ("n[01-03]", ["n01", "n02", "n03"]),  # zero padding
    ("n[098-100]", ["n098", "n099", "n100"]),
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("n[1-010]", [f"n{i}" for i in range(1, 11)]),  # the low end sets the width
    ("n[1-2,5,7-8]", ["n1", "n2", "n5", "n7", "n8"]),
    ("n[3,1]", ["n3", "n1"]),
    ("n[007]", ["n007"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("n[1-2]-ib", ["n1-ib", "n2-ib"]),  # suffix after the bracket
    ("gpu[1-2].ib.cluster", ["gpu1.ib.cluster", "gpu2.ib.cluster"]),
    ("a.example.org,b[1-2].example.org", ["a.example.org", "b1.example.org", "b2.example.org"]),
    ("n1,m[1-2],n1", ["n1", "m1", "m2", "n1"]),  # duplicates kept, as scontrol does
    ("n1 n2", ["n1", "n2"]),  # Slurm also splits at blanks
    ("n,,m,", ["n", "m"]),
    ("", []),
    # Several groups: Slurm varies the last fastest, then the first, second, ...
    (
        "r[1-2]n[3-4]x[5-6]",
        ["r1n3x5", "r1n3x6", "r2n3x5", "r2n3x6", "r1n4x5", "r1n4x6", "r2n4x5", "r2n4x6"],
    ),
    ("[1-2]", ["1", "2"]),
    ("n[0-0]", ["n0"]),
    ("N_1-a", ["N_1-a"]),
]


@pytest.mark.parametrize(("text", "hosts"), EXPANSIONS)
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


BAD_HOSTLISTS = [
    ("n[3-1]", "reversed range '3-1'"),
    ("n[1-2", "'[' without its ']'"),
    ("n1-2]", "']' without its '['"),
    ("n[[1-2]]", "nested brackets"),
    ("n[]", "empty brackets"),
    ("n[a-b]", "'a-b' in brackets"),
    ("n[1-]", "'1-' in brackets"),
    ("n[-2]", "'-2' in brackets"),
    ("n[1, 2]", "blank inside brackets"),
    ("n[0-999999]", "too many hosts"),
    ("a[1-1000]b[1-1000]", f"more than {MAX_HOSTS:,} hosts"),
    ("n:1", "':' in a host name"),
    ("n$(id)", "'$' in a host name"),
    ("n[\u0661-\u0663]", "in brackets"),  # Arabic-Indic digits are not ASCII digits
]


@pytest.mark.parametrize(("text", "problem"), BAD_HOSTLISTS)
def test_bad_hostlist_names_variable_value_and_hint(text: str, problem: str) -> None:
    with pytest.raises(InputError) as info:
        expand_hostlist(text, name="SLURM_STEP_NODELIST")
    message = str(info.value)
    assert message.startswith(f"SLURM_STEP_NODELIST={text!r}: "), message
    assert problem in message
    assert "HINT:" in message
    assert info.value.name == "SLURM_STEP_NODELIST"


def test_long_hostlist_is_shortened_in_the_message() -> None:
    text = ",".join(f"host{i}" for i in range(200)) + ",bad[1-"
    with pytest.raises(InputError) as info:
        expand_hostlist(text, name="SLURM_JOB_NODELIST")
    assert len(str(info.value)) < 400


def test_large_hostlist_is_fast_and_ordered() -> None:
    hosts = expand_hostlist("node[0001-4096]")
    assert len(hosts) == 4096
    assert hosts[:2] == ["node0001", "node0002"]
    assert hosts[-1] == "node4096"


COUNTS = [
    ("1", [1]),
    ("2(x3),1", [2, 2, 2, 1]),
    ("8(x4096)", [8] * 4096),
    ("1,2,3", [1, 2, 3]),
    ("0,1", [0, 1]),
    ("4(x1)", [4]),
]


@pytest.mark.parametrize(("text", "counts"), COUNTS)
def test_parse_task_counts(text: str, counts: list[int]) -> None:
    assert parse_task_counts(text) == counts


BAD_COUNTS = [
    ("", "is empty"),
    ("2(x)", "not a count"),
    ("(x3)", "not a count"),
    ("2(x3", "not a count"),
    ("-1", "not a count"),
    ("1.5", "not a count"),
    ("3(x0)", "zero times"),
    ("1(x999999999)", "more tasks or nodes"),
    ("99999999999", "more tasks or nodes"),
    ("1,,2", "not a count"),
]


@pytest.mark.parametrize(("text", "problem"), BAD_COUNTS)
def test_bad_task_counts(text: str, problem: str) -> None:
    with pytest.raises(InputError) as info:
        parse_task_counts(text, name="SLURM_STEP_TASKS_PER_NODE")
    message = str(info.value)
    assert message.startswith(f"SLURM_STEP_TASKS_PER_NODE={text!r}: ")
    assert problem in message
    assert "HINT:" in message
