"""scripts/tf-venv.sh: its refusals, and the reuse of a release's environment (the test
command builds the oldest release's before this suite, for the version matrix after it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slurmtf.tf.releases import OLDEST, RELEASES
from tests.prereqs import require

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "tf-venv.sh"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120, check=False, env=env)  # fmt: skip


@pytest.mark.parametrize("args", [[], ["2.16", "/a", "/b"], ["--help"]])
def test_usage_lists_the_releases(args: list[str]) -> None:
    done = _run(*args)
    assert done.returncode == 2
    assert "usage: bash scripts/tf-venv.sh VERSION [PREFIX]" in done.stderr
    assert " ".join(r.tensorflow for r in RELEASES) in done.stderr


@pytest.mark.parametrize("version", ["2.14", "2.16.1", "latest"])
def test_an_untested_release_is_refused_by_name(version: str, tmp_path: Path) -> None:
    done = _run(version, str(tmp_path / "venv"))
    assert done.returncode == 2
    assert f"TensorFlow {version!r} is not a tested release" in done.stderr
    assert not (tmp_path / "venv").exists()


@pytest.mark.slow
def test_the_oldest_releases_environment_is_reused() -> None:
    prefix = Path(f"/opt/tensorflow-{OLDEST.tensorflow}")
    require((prefix / ".slurmtf-venv").is_file(), f"{prefix} (bash scripts/tf-venv.sh 2.15)")
    done = _run(OLDEST.series)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == str(prefix)
    assert f"already holds TensorFlow {OLDEST.tensorflow}" in done.stderr
    version = subprocess.run(
        [str(prefix / "bin" / "python"), "-c",
         "import importlib.metadata as m; print(m.version('tensorflow-cpu'), m.version('keras'))"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert version.stdout.split() == [OLDEST.tensorflow, OLDEST.keras]
