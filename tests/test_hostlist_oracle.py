"""Our hostlist expansion against Slurm's own: ``scontrol show hostnames``.

Needs only the slurm-client binary (no daemons): a minimal slurm.conf is written to a
temporary directory. Random hostlists are batched, many per ``scontrol`` call;
``SLURMTF_ORACLE_EXAMPLES`` sets the number of batches (default 150, a few seconds;
3,000 took ~30 s on 2 cores and found no difference).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmtf.cluster.hostlists import expand_hostlist
from slurmtf.errors import InputError
from tests.prereqs import require

SLURM_CONF = "ClusterName=oracle\nSlurmctldHost=localhost\nNodeName=n1\nPartitionName=p Nodes=n1\n"


class Scontrol:
    """``scontrol show hostnames`` with a private minimal slurm.conf."""

    def __init__(self, binary: str, conf: Path) -> None:
        self.binary = binary
        self.env = {"PATH": os.environ.get("PATH", ""), "SLURM_CONF": str(conf)}

    def expand(self, text: str) -> list[str]:
        done = subprocess.run(
            [self.binary, "show", "hostnames", text],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=30,
            check=False,
        )
        return done.stdout.split()


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory: pytest.TempPathFactory) -> Scontrol:
    """Slurm's own hostlist expansion (needs only the slurm-client binary)."""
    binary = shutil.which("scontrol")
    require(binary is not None, "scontrol (Debian package slurm-client)")
    assert binary is not None
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text(SLURM_CONF)
    return Scontrol(binary, conf)


@st.composite
def rangelists(draw: st.DrawFn) -> str:
    """The inside of one bracket pair: ``7``, ``01-03`` or ``1-2,5``."""
    items = []
    for _ in range(draw(st.integers(1, 2))):
        low = draw(st.integers(0, 120))
        width = draw(st.integers(0, 4))
        low_text = f"{low:0{width}d}"
        span = draw(st.integers(0, 3))
        if span == 0 and draw(st.booleans()):
            items.append(low_text)
            continue
        high = low + span
        high_width = draw(st.integers(0, 4))
        items.append(f"{low_text}-{high:0{high_width}d}")
    return ",".join(items)


@st.composite
def hostlist_items(draw: st.DrawFn) -> str:
    """One comma item: a name with up to three bracket groups (none after the last)."""
    text = draw(st.from_regex(r"[a-zA-Z][a-zA-Z0-9_.-]{0,5}", fullmatch=True))
    groups = draw(st.integers(0, 3))
    for i in range(groups):
        text += "[" + draw(rangelists()) + "]"
        if i < groups - 1:
            text += draw(st.from_regex(r"[a-z0-9_.-]{0,3}", fullmatch=True))
    return text


@pytest.mark.slow
@settings(
    max_examples=int(os.environ.get("SLURMTF_ORACLE_EXAMPLES", "150")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(items=st.lists(hostlist_items(), min_size=1, max_size=10))
def test_expansion_matches_scontrol(scontrol: Scontrol, items: list[str]) -> None:
    text = ",".join(items)
    ours = expand_hostlist(text)
    theirs = scontrol.expand(text)
    if ours != theirs:  # narrow the report down to the item that differs
        for item in items:
            assert expand_hostlist(item) == scontrol.expand(item), item
    assert ours == theirs


FIXED = [
    "node[9-11]",
    "node10,node9",
    "rack[1-2]-n[1-2]",
    "r[1-2]n[3-4]x[5-6]",
    "a[1-2]b[1-2]c[1-2]d[1-2]",
    "n[01-03],r[1-2]-g[9-10]",
    "n[098-100]",
    "n[01-9]",
    "n[1-09]",
    "n[1-010]",
    "n1,n1,n2",
    "n[1-3,2]",
    "a.b.c,d.e[1-2]",
    "n1 n2",
    "n,,m",
    "[1-2]",
]


@pytest.mark.parametrize("text", FIXED)
def test_known_cases_match_scontrol(scontrol: Scontrol, text: str) -> None:
    assert expand_hostlist(text) == scontrol.expand(text)


@pytest.mark.parametrize("text", ["n[3-1]", "n[a-b]", "n[]", "n[[1-2]]", "n[1-2]]", "n[-2]"])
def test_both_reject(scontrol: Scontrol, text: str) -> None:
    assert scontrol.expand(text) == []
    with pytest.raises(InputError):
        expand_hostlist(text)
