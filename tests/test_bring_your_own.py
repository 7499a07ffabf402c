"""Bring your own model, the parts without TensorFlow: --legacy_keras, jobs/train.sbatch
usage, the Keras version guard and switches of slurmtf.tf.keras_compat."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmtf.cli import submit as submit_cli
from slurmtf.spec.jobspec import LEGACY_KERAS_ENV, JobSpec
from slurmtf.tf import keras_compat

REPO = Path(__file__).resolve().parents[1]
PRINT_ENV = (
    f"{sys.executable} -c \"import os; print('LEGACY', os.environ.get('{LEGACY_KERAS_ENV}'))\""
)


@pytest.mark.parametrize(("flag", "expected"), [([], "None"), (["--legacy_keras"], "1")])
def test_legacy_keras_reaches_every_task(
    tmp_path: Path, fake_slurm_env: object, flag: list[str], expected: str
) -> None:
    argv = ["--cluster=local", "--nodes=2", f"--log_dir={tmp_path}", f"--command={PRINT_ENV}"]
    assert submit_cli.main([*argv, *flag], out=io.StringIO()) == 0
    logs = sorted(tmp_path.glob("*_log.out"))
    assert len(logs) == 2
    for path in logs:
        assert f"LEGACY {expected}" in path.read_text().splitlines()


def test_legacy_keras_in_dry_run_and_spec_json() -> None:
    out = io.StringIO()
    assert submit_cli.main(["--dry_run", "--legacy_keras", "--module=mypkg.train"], out=out) == 0
    assert f"{LEGACY_KERAS_ENV}=1" in out.getvalue()
    spec = JobSpec(kind="module", target="mypkg.train", legacy_keras=True)
    assert JobSpec.from_json(json.loads(json.dumps(spec.to_json()))).legacy_keras is True


def test_train_sbatch_without_a_script_is_a_usage_error() -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "jobs" / "train.sbatch")], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2
    assert "usage: sbatch jobs/train.sbatch SCRIPT.py" in proc.stderr


@pytest.mark.parametrize(
    ("version", "ok"),
    [("3.15.1", True), ("3.15", True), ("3.15.0.dev2026", True), ("3.16.0", False),
     ("3.1.5", False), ("3.150.0", False), ("2.21.0", False), ("3.3.3", True), ("3.5.0", True),
     ("3.8.0", True), ("3.4.1", False)],
)  # fmt: skip
def test_tested_keras_versions(version: str, ok: bool) -> None:
    assert keras_compat.tested(version) is ok


class _Keras35EpochIterator:
    """Keras 3.5's TFEpochIterator: not iterable; ``enumerate_epoch()`` yields pairs."""

    def __init__(self, batches: list[str]) -> None:
        self.batches = batches

    def enumerate_epoch(self) -> Iterator[tuple[int, Iterator[str]]]:
        yield 0, iter(self.batches)


@pytest.mark.parametrize(
    "epoch_iterator",
    [
        _Keras35EpochIterator(["first", "second"]),  # Keras 3.5
        [(0, iter(["first", "second"]))],  # 3.8-3.10: (step, iterator)
        [(0, 1, iter(["first", "second"]))],  # 3.11 and later: (begin, end, iterator)
    ],
    ids=["enumerate_epoch", "pairs", "triples"],
)
def test_first_batch_of_every_keras_epoch_iterator(epoch_iterator: object) -> None:
    assert keras_compat.first_batch(epoch_iterator) == "first"


@pytest.mark.parametrize(
    ("value", "legacy"), [("1", True), ("true", True), ("YES", True), ("0", False), ("", False)]
)
def test_legacy_keras_selected(value: str, legacy: bool) -> None:
    assert keras_compat.legacy_keras_selected({"TF_USE_LEGACY_KERAS": value}) is legacy


def test_compat_switched_off_never_imports_keras() -> None:
    code = (
        "import sys; from slurmtf import keras_compat as k;"
        "assert k.enable_multiworker_fit(environ={'SLURMTF_KERAS_COMPAT': '0'}) is False;"
        "assert 'keras' not in sys.modules and 'tensorflow' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_modules_import_without_tensorflow() -> None:
    code = (
        "import sys, slurmtf.train, slurmtf.fit, slurmtf.tf.keras_compat;"
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_non_chief_files_go_to_a_private_folder(tmp_path: Path) -> None:
    private = Path(keras_compat._private(str(tmp_path / "run" / "ckpt.weights.h5")))
    assert private.name == "ckpt.weights.h5"
    assert not private.is_relative_to(tmp_path)
    assert private.parent.parts[-1] == "run"
    assert private.is_relative_to(keras_compat.worker_tmpdir())


class _Extended:
    def __init__(self, chief: bool) -> None:
        self.should_checkpoint = chief


class _Model:
    def __init__(self, chief: bool) -> None:
        self.distribute_strategy = type("S", (), {"extended": _Extended(chief)})()


@pytest.mark.parametrize("chief", [True, False])
def test_is_chief_follows_the_strategy(chief: bool) -> None:
    assert keras_compat.is_chief(_Model(chief)) is chief
