"""What the wheel installs: slurmtf and the bundled models as ``slurmtf_models``."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]


def _declared() -> tuple[list[str], dict[str, str]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    return list(config["packages"]), dict(config["package-dir"])


def test_every_package_folder_is_declared() -> None:
    packages, package_dir = _declared()
    found = set()
    for top, name in (("slurmtf", "slurmtf"), ("models", "slurmtf_models")):
        for init in (REPO / top).rglob("__init__.py"):
            parts = init.parent.relative_to(REPO / top).parts
            found.add(".".join((name, *parts)))
    assert found == set(packages)
    assert package_dir == {"slurmtf_models": "models"}


@pytest.mark.slow
def test_the_wheel_has_no_top_level_models_package(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("slurmtf-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/", 1)[0] for name in names if "/" in name}
    assert {"slurmtf", "slurmtf_models"} <= tops
    assert "models" not in tops
    assert "slurmtf_models/data/splits.py" in names
    assert not any(name.startswith(("tests/", "benchmarks/")) for name in names)
