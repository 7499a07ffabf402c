"""Which TensorFlow is installed, and the one line a release outside the tested range, a
TensorFlow that cannot be imported or GPUs TensorFlow cannot see get. The range checks
run real processes against a stand-in distribution's metadata (no TensorFlow imported)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmtf.errors import InputError
from slurmtf.runtime.job.commands import find_model
from slurmtf.runtime.job.settings import JobSettings, JobStop
from slurmtf.tf import install, releases

REPO = Path(__file__).resolve().parents[1]


def _versions(found: dict[str, str]) -> object:
    def version_of(name: str) -> str:
        if name not in found:
            raise importlib.metadata.PackageNotFoundError(name)
        return found[name]

    return version_of


def test_the_installed_distribution_is_found_by_name() -> None:
    assert install.installed(_versions({"tensorflow-cpu": "2.17.1"})) == install.Installed(  # type: ignore[arg-type]
        "tensorflow-cpu", "2.17.1"
    )
    assert install.installed(_versions({"tensorflow": "2.15.1"})).cpu_only is False  # type: ignore[arg-type, union-attr]
    assert install.installed(_versions({})) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("version", "where"),
    [("2.14.1", "older"), ("2.12.0", "older"), ("2.15.0", None), ("2.15.1", None),
     ("2.18.0rc1", None), ("2.21.0", None), ("2.22.0", "newer"), ("3.0.0", "newer"),
     ("nightly", None)],
)  # fmt: skip
def test_a_version_inside_or_outside_the_tested_range(version: str, where: str | None) -> None:
    assert releases.outside(version) == where


def test_an_older_release_is_an_error_naming_it_and_the_fix() -> None:
    with pytest.raises(InputError) as caught:
        install.check_release(install.Installed("tensorflow-cpu", "2.14.1"))
    line = str(caught.value)
    assert line.startswith("TensorFlow='tensorflow-cpu 2.14.1': is older than the releases")
    assert f"({releases.TESTED_RANGE})" in line
    assert f"'tensorflow[and-cuda]>={releases.OLDEST.tensorflow}'" in line


def test_a_newer_release_is_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    found = install.Installed("tensorflow", "2.23.0")
    assert install.check_release(found) == found
    (record,) = caplog.records
    assert record.levelname == "WARNING"
    assert "TensorFlow 2.23.0 (tensorflow) is newer than the releases" in record.getMessage()


def test_the_tested_releases_run_without_a_line(caplog: pytest.LogCaptureFixture) -> None:
    for release in releases.RELEASES:
        install.check_release(install.Installed("tensorflow-cpu", release.tensorflow))
    assert caplog.records == []


@pytest.mark.parametrize(
    ("build", "loaded", "says"),
    [
        (install.Build(False), set(), "tensorflow-cpu 2.17.1 is a CPU-only build"),
        (install.Build(True, "12.3", "8"), {"libcuda.so.1", "libcudart.so.12"},
         "cannot load libcudnn.so.8"),
        (install.Build(True, "12.3", "8"), set(),
         "cannot load libcuda.so.1, libcudart.so.12, libcudnn.so.8"),
        (install.Build(True, "12.3", "8"), {"libcuda.so.1", "libcudart.so.12", "libcudnn.so.8"},
         "the GPUs did not initialise"),
    ],
)  # fmt: skip
def test_gpus_tensorflow_cannot_see_get_the_reason(
    build: install.Build, loaded: set[str], says: str
) -> None:
    wheel = "tensorflow-cpu" if not build.cuda else "tensorflow"
    line = install.unseen_gpus_line(
        install.Installed(wheel, "2.17.1"), build, ["0", "1"], load=loaded.__contains__
    )
    assert says in line
    assert "CUDA_VISIBLE_DEVICES=0,1" in line
    assert "HINT:" in line
    assert "'tensorflow[and-cuda]==2.17.1'" in line


def test_build_info_of_a_cuda_build() -> None:
    build = install.Build.of(
        {"is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9"}
    )
    assert build.libraries() == ["libcuda.so.1", "libcudart.so.12", "libcudnn.so.9"]


# ---------------------------------------------------------------- real processes
def _stand_in(root: Path, version: str) -> Path:
    """A folder that, first on PYTHONPATH, makes ``tensorflow-cpu VERSION`` the installed
    distribution (its metadata only; no ``tensorflow`` package to import)."""
    info = root / f"tensorflow_cpu-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: tensorflow-cpu\nVersion: {version}\n"
    )
    return root


def _env(stand_in: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{stand_in}{os.pathsep}{REPO}"}


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip


def test_a_bundled_model_on_an_older_release_stops_at_once(tmp_path: Path) -> None:
    env = _env(_stand_in(tmp_path / "site", "2.14.1"))
    done = _run([sys.executable, "-m", "models.mnist", "--train_steps=1"], REPO, env)
    assert done.returncode == 2, done
    (line,) = done.stderr.strip().splitlines()
    assert "TensorFlow='tensorflow-cpu 2.14.1': is older than the releases" in line
    assert "Traceback" not in done.stderr


def test_a_users_script_on_a_newer_release_runs_after_one_warning(tmp_path: Path) -> None:
    env = _env(_stand_in(tmp_path / "site", "2.30.0"))
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    done = _run([sys.executable, "-m", "slurmtf.run", str(script)], tmp_path, env)
    assert done.returncode == 0, done
    assert "trained" in done.stdout
    warned = [x for x in done.stderr.splitlines() if "is newer than the releases" in x]
    assert len(warned) == 1, done.stderr


def test_the_supervisor_stops_an_older_release_before_srun(tmp_path: Path) -> None:
    stand_in = _stand_in(tmp_path / "site", "2.13.1")
    (stand_in / "tensorflow").mkdir()
    (stand_in / "tensorflow" / "__init__.py").write_text("")  # find_spec finds a package
    job = JobSettings.read("mnist", {"SLURMTF_REPO": str(REPO), "PYTHON": sys.executable})
    with pytest.raises(JobStop) as caught:
        find_model(job, _env(stand_in))
    assert "TensorFlow='tensorflow-cpu 2.13.1': is older than" in str(caught.value)
    assert 'pip install "slurmtf' not in str(caught.value)  # TensorFlow is installed: no such hint
