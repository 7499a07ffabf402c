"""What the wheel installs (slurmtf, the bundled models as ``slurmtf_models``, the job
scripts), and that the extras resolve as the README documents them, checked with pip's
resolver (``--dry-run``) without installing or downloading TensorFlow again."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from slurmtf.tf.releases import SLOW_ML_DTYPES
from tests.prereqs import require

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
    for script in sorted((REPO / "jobs").glob("*.sbatch")):  # files, not the links
        shipped = zipfile.ZipFile(wheel).read(f"slurmtf/sbatch/{script.name}")
        assert shipped == script.read_bytes(), script.name
    assert "slurmtf/job.sh" in names
    # The node epilog is a link to the prolog in the checkout, a file of its own here.
    archive = zipfile.ZipFile(wheel)
    prolog = archive.getinfo("slurmtf/firewall/prolog.sh")
    epilog = archive.getinfo("slurmtf/firewall/epilog.sh")
    assert archive.read(epilog) == archive.read(prolog)
    assert epilog.external_attr >> 16 & 0o100, "slurmd runs the epilog: it must be executable"


def _dry_run(*args: str, index: str = "") -> dict[str, Any]:
    """pip's resolver on ``args``: the report of what it would install (nothing is).
    ``index``: packages that only an index has; missing there is a missing prerequisite."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
         "--disable-pip-version-check", *args],
        capture_output=True, text=True, timeout=300, check=False, cwd=REPO,
    )  # fmt: skip
    if index:
        require("No matching distribution" not in done.stderr, f"a package index with {index}")
    assert done.returncode == 0, f"pip {args}: {done.stderr[-3000:]}"
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _declared_requirements() -> tuple[list[str], dict[str, list[str]]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"]), dict(project["optional-dependencies"])


@pytest.mark.slow
def test_cpu_data_dev_extras_resolve_offline_over_this_environment() -> None:
    """The environment the tests run in satisfies slurmtf's requirements and its `cpu`,
    `data`, `dev` and `tensorboard` extras as declared: the resolver, with no index at
    all, has nothing to add."""
    runtime, extras = _declared_requirements()
    wanted = [
        *runtime,
        *(r for name in ("cpu", "data", "dev", "tensorboard") for r in extras[name]),
    ]
    assert _dry_run("--no-index", *wanted)["install"] == []


@pytest.mark.slow
def test_gpu_and_keras2_extras_resolve_on_the_index() -> None:
    """`[gpu]` names a TensorFlow with the CUDA libraries and `[keras2]` a tf-keras for
    that TensorFlow: each requirement as pyproject declares it, resolved on the package
    index from its metadata only (no dependencies, no wheel downloaded)."""
    _, extras = _declared_requirements()
    args = ("--no-deps", "--ignore-installed", *extras["gpu"], *extras["keras2"])
    report = _dry_run(*args, index="tensorflow and tf-keras (pypi.org)")
    found = {canonicalize_name(item["metadata"]["name"]): item for item in report["install"]}
    assert sorted(found) == ["ml-dtypes", "tensorflow", "tf-keras"], sorted(found)
    tensorflow = found["tensorflow"]["metadata"]
    assert found["tensorflow"]["requested_extras"] == ["and-cuda"]
    cuda = [r for r in tensorflow["requires_dist"] if 'extra == "and-cuda"' in r]
    assert any(r.startswith("nvidia-cudnn") for r in cuda), cuda
    wants = [
        Requirement(r) for r in found["tf-keras"]["metadata"]["requires_dist"]
        if r.startswith("tensorflow")
    ]  # fmt: skip
    assert wants, found["tf-keras"]["metadata"]["requires_dist"]
    assert all(tensorflow["version"] in want.specifier for want in wants), wants
    assert found["ml-dtypes"]["metadata"]["version"] in Requirement(SLOW_ML_DTYPES).specifier


def test_every_tensorflow_environment_leaves_out_the_slow_ml_dtypes() -> None:
    """The cpu and gpu extras and each release's test environment exclude ml_dtypes 0.7.0
    (its import costs every rank 0.6 s of CPU), by the one requirement."""
    from slurmtf.tf.releases import RELEASES

    _, extras = _declared_requirements()
    assert SLOW_ML_DTYPES in extras["cpu"], extras["cpu"]
    assert SLOW_ML_DTYPES in extras["gpu"], extras["gpu"]
    assert all(SLOW_ML_DTYPES in release.requirements() for release in RELEASES)


def test_the_tensorflow_floor_is_the_oldest_tested_release() -> None:
    """pyproject's lower bounds are the oldest release of the matrix (slurmtf/tf/releases.py)."""
    from slurmtf.tf.releases import OLDEST

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    floors = {}
    for extra in ("cpu", "gpu", "keras2"):
        (requirement,) = [r for r in map(Requirement, extras[extra]) if r.name != "ml_dtypes"]
        (spec,) = requirement.specifier
        floors[canonicalize_name(requirement.name)] = (spec.operator, spec.version)
    assert floors == {
        "tensorflow-cpu": (">=", OLDEST.series),
        "tensorflow": (">=", OLDEST.series),
        "tf-keras": (">=", OLDEST.series),
    }
