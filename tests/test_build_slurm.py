"""scripts/build-slurm.sh without building: its checks on the tarball and the reuse of an
earlier build (the build itself runs in the test command, before the version matrix)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build-slurm.sh"
OPTIONS_LINE = "--enable-multiple-slurmd"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, check=False
    )


def _tarball(tmp_path: Path, name: str = "slurm-26.05.3.tar.xz") -> Path:
    path = tmp_path / "src" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not really a tarball")
    return path


@pytest.mark.parametrize("args", [[], ["a", "b", "c"], ["--help"]])
def test_usage(args: list[str]) -> None:
    done = _run(*args)
    assert done.returncode == 2
    assert "usage: bash scripts/build-slurm.sh TARBALL [PREFIX]" in done.stderr


def test_a_missing_tarball_is_named(tmp_path: Path) -> None:
    done = _run(str(tmp_path / "slurm-26.05.3.tar.xz"))
    assert done.returncode == 2
    assert f"TARBALL={tmp_path}/slurm-26.05.3.tar.xz does not exist" in done.stderr


def test_a_tarball_without_a_release_name_is_refused(tmp_path: Path) -> None:
    done = _run(str(_tarball(tmp_path, "slurm-latest.tar.gz")))
    assert done.returncode == 2
    assert "TARBALL=slurm-latest.tar.gz is not named slurm-X.Y.Z.tar" in done.stderr


def test_a_checksum_that_does_not_match_stops_before_building(tmp_path: Path) -> None:
    tarball = _tarball(tmp_path)
    (tarball.parent / "SHA256SUMS").write_text(f"{'0' * 64}  {tarball.name}\n")
    done = _run(str(tarball), str(tmp_path / "prefix"))
    assert done.returncode == 1
    assert f"{tarball.name} has SHA-256 {hashlib.sha256(b'not really a tarball').hexdigest()}" in (
        done.stderr
    )
    assert "HINT: the tarball is damaged" in done.stderr
    assert not (tmp_path / "prefix").exists()


def test_a_sums_file_without_the_tarball_stops(tmp_path: Path) -> None:
    tarball = _tarball(tmp_path)
    (tarball.parent / "SHA256SUMS").write_text(f"{'0' * 64}  slurm-25.11.7.tar.xz\n")
    done = _run(str(tarball), str(tmp_path / "prefix"))
    assert done.returncode == 1
    assert "SHA256SUMS has no line for slurm-26.05.3.tar.xz" in done.stderr


def test_an_earlier_build_of_the_same_tarball_is_reused(tmp_path: Path) -> None:
    """The stamp holds the tarball's checksum and the configure options: a match prints
    the prefix at once; another tarball (or none) would build again."""
    tarball = _tarball(tmp_path)
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    (tarball.parent / "SHA256SUMS").write_text(f"{digest} *{tarball.name}\n")  # binary mode
    prefix = tmp_path / "prefix"
    (prefix / "sbin").mkdir(parents=True)
    daemon = prefix / "sbin" / "slurmctld"
    daemon.write_text("#!/bin/sh\necho slurm 26.05.3\n")
    daemon.chmod(0o755)
    stamp_options = " ".join(SCRIPT.read_text().split("options=(", 1)[1].split(")", 1)[0].split())
    assert OPTIONS_LINE in stamp_options
    (prefix / ".slurmtf-build").write_text(f"{digest} {stamp_options}\n")
    done = _run(str(tarball), str(prefix))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == str(prefix)
    assert "already holds this build" in done.stderr
