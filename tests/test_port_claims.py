"""Port claims: a base handed out is skipped by later picks, in this process and others."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slurmtf.cluster import port_claims
from slurmtf.cluster.port_claims import Claim, held_claims, parse_claims
from slurmtf.cluster.ports import free_port_base, ports_free


@pytest.fixture(autouse=True)
def claims_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "claims"
    monkeypatch.setattr(port_claims, "CLAIMS_FILE", path)
    return path


def test_parse_claims_keeps_the_live_ones_and_drops_what_does_not_parse() -> None:
    text = "61000 5 200\n61010 2 99\nnot a claim\n61020 1\n62000 3 300\n"
    assert parse_claims(text, now=100) == [Claim(61000, 5, 200), Claim(62000, 3, 300)]


@pytest.mark.parametrize(
    ("base", "count", "overlaps"),
    [(61000, 5, True), (60996, 5, True), (61004, 1, True), (61005, 3, False), (60995, 5, False)],
)
def test_a_claim_overlaps_a_range_sharing_a_port(base: int, count: int, overlaps: bool) -> None:
    assert Claim(61000, 5, 1e12).overlaps(base, count) is overlaps


def test_later_picks_never_meet_a_claimed_base(claims_file: Path) -> None:
    """Bases low..low+3 of two ports each: whatever the first pick, a disjoint one is left."""
    low = next(b for b in range(61000, 64990, 7) if ports_free(b, 6))
    for _ in range(20):
        claims_file.write_text("")
        first, second = free_port_base(2, low, low + 6), free_port_base(2, low, low + 6)
        assert abs(first - second) >= 2, (first, second)
    kept = parse_claims(claims_file.read_text(), now=0)
    assert [(c.base, c.count) for c in kept] == [(first, 2), (second, 2)]


def test_a_claim_made_in_another_process_is_seen(claims_file: Path) -> None:
    code = (
        "import sys, time; from pathlib import Path; "
        "from slurmtf.cluster.port_claims import Claim, held_claims\n"
        "with held_claims(Path(sys.argv[1])) as claims:\n"
        "    claims.append(Claim(63000, 4, time.time() + 60))\n"
    )
    subprocess.run([sys.executable, "-c", code, str(claims_file)], check=True, timeout=60)
    with held_claims() as claims:
        assert [(c.base, c.count) for c in claims] == [(63000, 4)]


def test_an_unusable_file_keeps_the_claims_in_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(port_claims, "CLAIMS_FILE", tmp_path / "missing" / "claims")
    with held_claims() as claims:
        claims.append(Claim(64000, 2, 1e12))
    with held_claims() as claims:
        assert Claim(64000, 2, 1e12) in claims
        claims.remove(Claim(64000, 2, 1e12))
