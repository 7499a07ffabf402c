"""The competing job's command line (another user's exclusive job for our nodes)."""

from __future__ import annotations

import pytest

from slurmtf.errors import InputError
from slurmtf.sandbox.competitor import competitor_args


def test_an_exclusive_job_for_as_many_nodes() -> None:
    assert competitor_args(2, 120) == [
        "sbatch", "--parsable", "--job-name=competitor", "--exclusive", "--nodes=2",
        "--chdir=/tmp", "--output=/dev/null", "--time=60", "--wrap=sleep 120",
    ]  # fmt: skip


def test_named_nodes_and_another_user() -> None:
    args = competitor_args(3, 30, nodelist="node[1-3]", user="nobody")
    assert "--nodelist=node[1-3]" in args
    assert "--uid=nobody" in args
    assert args[-1] == "--wrap=sleep 30"


@pytest.mark.parametrize(("nodes", "seconds", "name"), [(0, 120, "nodes"), (2, 0, "seconds")])
def test_bad_values_name_the_argument(nodes: int, seconds: int, name: str) -> None:
    with pytest.raises(InputError, match="HINT: ") as info:
        competitor_args(nodes, seconds)
    assert info.value.name == name
