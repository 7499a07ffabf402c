"""The version matrix (`pytest -m matrix`, scripts/matrix.sh) selects what
docs/SLURM_VERSIONS.md says it runs on every release: each test named in its table."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "SLURM_VERSIONS.md"


def _documented() -> list[str]:
    """``test_x.py`` or ``test_x.py::test_name`` from the table's last column."""
    table = DOC.read_text().split("## The version matrix", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"`(test_\w+\.py(?:::test_\w+)?)`", table)


@pytest.mark.slow
def test_the_matrix_selects_every_documented_test() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "matrix", "tests/e2e"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    selected = [line for line in done.stdout.splitlines() if line.startswith("tests/e2e/")]
    documented = _documented()
    assert len(documented) >= 12
    for name in documented:
        assert any(f"/{name}" in test for test in selected), f"{name} is not in -m matrix"
    files = {test.split("::")[0].rsplit("/", 1)[-1] for test in selected}
    undocumented = files - {name.split("::")[0] for name in documented}
    assert not undocumented, f"docs/SLURM_VERSIONS.md's table does not name {undocumented}"
