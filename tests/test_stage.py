"""Staging a data set to node-local scratch: copy, verify, reuse, refuse, remove."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurmtf.cli import data as data_cli
from slurmtf.cluster.layout import ClusterLayout
from slurmtf.datasets import stage
from slurmtf.errors import InputError
from slurmtf.events import parse_events
from tests.helpers.datafiles import with_manifest, write_mnist


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return with_manifest(write_mnist(tmp_path / "shared" / "mnist", n_train=16, n_eval=8))


def env(tmp_path: Path, node: str = "node1", job: str = "42") -> dict[str, str]:
    return {"SLURM_TMPDIR": str(tmp_path / "scratch" / node), "SLURM_JOB_ID": job}


def test_stage_copies_verifies_and_reuses(src: Path, tmp_path: Path) -> None:
    first = stage.stage(src, env(tmp_path))
    assert first.path == tmp_path / "scratch" / "node1" / "slurmtf-data-42" / "mnist"
    assert not first.reused
    assert first.bytes == sum(p.stat().st_size for p in src.glob("*.gz"))
    assert sorted(p.name for p in first.path.iterdir()) == sorted(
        [*(p.name for p in src.iterdir()), stage.MARKER]
    )
    again = stage.stage(src, env(tmp_path))  # a requeued job on this node
    assert again.reused
    assert again.path == first.path
    other = stage.stage(src, env(tmp_path, "node2"))  # each node its own copy
    assert not other.reused
    assert stage.resolve_data_dir(str(src), {**env(tmp_path), stage.STAGED_ENV: str(src)}) == str(
        first.path
    )
    assert stage.resolve_data_dir(str(src), env(tmp_path)) == str(src)  # not staged
    assert stage.unstage(env(tmp_path)) == first.path.parent
    assert not first.path.parent.exists()
    assert other.path.exists()


def test_a_changed_manifest_is_not_reused(src: Path, tmp_path: Path) -> None:
    stage.stage(src, env(tmp_path))
    (src / "extra.bin").write_bytes(b"new file")
    with_manifest(src)
    again = stage.stage(src, env(tmp_path))
    assert not again.reused
    assert (again.path / "extra.bin").read_bytes() == b"new file"


def test_a_corrupted_file_is_one_line_and_leaves_nothing(src: Path, tmp_path: Path) -> None:
    victim = src / "train-labels-idx1-ubyte.gz"
    victim.write_bytes(victim.read_bytes()[:-3] + b"xyz")
    with pytest.raises(InputError) as caught:
        stage.stage(src, env(tmp_path))
    message = str(caught.value)
    assert str(victim) in message
    assert "does not match" in message
    assert "HINT: " in message
    assert "\n" not in message
    assert list((tmp_path / "scratch" / "node1").rglob("*")) == [
        tmp_path / "scratch" / "node1" / "slurmtf-data-42"
    ]


def test_too_little_space_names_path_needed_and_free(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(10, 10, 100))  # type: ignore[attr-defined]
    with pytest.raises(InputError, match=r"STAGE_DIR=.*node1.*has 100 B free.*needs .*KiB.*HINT"):
        stage.stage(src, env(tmp_path))


def test_root_order_and_unstaged_copy_refused(tmp_path: Path) -> None:
    assert stage.stage_root({"STAGE_DIR": "/a", "SLURM_TMPDIR": "/b", "TMPDIR": "/c"}) == Path("/a")
    assert stage.stage_root({"SLURM_TMPDIR": "/b", "TMPDIR": "/c"}) == Path("/b")
    assert stage.stage_root({}) == Path("/tmp")
    with pytest.raises(InputError, match="no verified copy"):
        stage.resolve_data_dir("/x/mnist", {stage.STAGED_ENV: "/x/mnist", "TMPDIR": str(tmp_path)})


def test_no_manifest_is_refused(tmp_path: Path) -> None:
    bare = write_mnist(tmp_path / "bare", n_train=4, n_eval=4)
    with pytest.raises(InputError, match=r"has no MANIFEST\.json"):
        stage.stage(bare, env(tmp_path))


def test_cli_prints_the_staged_event(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in env(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    assert data_cli.main(["stage", str(src)]) == 0
    event = json.loads(capsys.readouterr().out)
    assert event["event"] == "staged"
    assert event["node"] == "node1"
    assert event["reused"] is False
    assert Path(event["path"]).is_dir()
    assert data_cli.main(["unstage"]) == 0
    assert not Path(event["path"]).exists()
    (src / "t10k-images-idx3-ubyte.gz").write_bytes(b"broken")
    assert data_cli.main(["stage", str(src)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("slurmtf data stage: ")


def test_submit_stage_data_renders_the_stage_step(capsys: pytest.CaptureFixture[str]) -> None:
    import io

    from slurmtf.cli import submit as submit_cli

    out = io.StringIO()
    argv = ["--dry_run", "--model=mnist", "--nodes=2", "--stage_data", "--", "--data_dir=/d/m"]
    assert submit_cli.main(argv, out=out) == 0
    assert " --stage_data --data_dir=/d/m -- " in out.getvalue()
    assert submit_cli.main(["--dry_run", "--model=mnist", "--stage_data"], out=out) == 2
    err = capsys.readouterr().err
    assert "--stage_data=True" in err
    assert "HINT: e.g. --stage_data -- --data_dir=" in err


@pytest.mark.parametrize(
    ("fields", "source"),
    [
        ({"kind": "model", "target": "mnist", "args": ("--data_dir", "/d/m")}, "/d/m"),
        ({"kind": "model", "target": "mnist", "args": ("--data_dir=/a", "--data_dir=/b")}, "/b"),
        ({"kind": "command", "target": "python t.py --data_dir=/c --x"}, "/c"),
        (
            {"kind": "command", "target": "python t.py --data_dir /c", "args": ("--data_dir=/e",)},
            "/e",
        ),
    ],
)
def test_submit_stages_the_data_dir_in_either_form(fields: dict[str, object], source: str) -> None:
    from slurmtf.spec.jobspec import JobSpec, staged_source

    assert staged_source(JobSpec(stage_data=True, **fields)) == source  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "source"),
    [
        (["/env"], "/env"),  # DATA_DIR alone
        (["/env", "--train_steps=2", "--data_dir=/flag"], "/flag"),
        (["/env", "--data_dir", "/next", "--x"], "/next"),
        (["", "--data_dir=/a", "--data_dir", "/b"], "/b"),  # the last wins, as in absl
        (["", "--data_dir"], ""),
        (["/env", "--", "--data_dir=/script"], "/env"),  # after `--`: not the model's flag
        ([""], ""),
    ],
)
def test_job_scripts_take_the_data_set_from_data_dir_or_the_flag(
    args: list[str], source: str
) -> None:
    from slurmtf.runtime.job.commands import data_source

    assert data_source(args[0], args[1:]) == source


def test_stage_data_without_a_data_set_is_one_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from slurmtf.cli import job as job_cli

    environ = {"STAGE_DATA": "1", "LOG_DIR": str(tmp_path / "l"), "MODEL_DIR": str(tmp_path),
               "PATH": "/usr/bin:/bin"}  # fmt: skip
    assert job_cli.main(["train", "--", "t.py", "--x"], environ) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1, err
    assert "STAGE_DATA='1': names no data set to stage. HINT: set DATA_DIR, or pass" in err


def test_the_launcher_hands_scripts_the_staged_copy(src: Path, tmp_path: Path) -> None:
    from slurmtf.runtime.rank.script import Target, task_target

    copy = stage.stage(src, env(tmp_path)).path
    environ = {**env(tmp_path), stage.STAGED_ENV: str(src), "DATA_DIR": str(src)}
    args = (f"--data_dir={src}", "--data_dir", str(src), "--other=1", "--", f"--data_dir={src}")
    assert stage.staged_args(args, environ) == (
        f"--data_dir={copy}", "--data_dir", str(copy), "--other=1", "--", f"--data_dir={src}",
    )  # fmt: skip
    assert stage.staged_args(args, env(tmp_path)) == args  # nothing staged
    assert stage.staged_args(("--data_dir=/else",), environ) == ("--data_dir=/else",)
    ran = task_target(Target("t.py", (f"--data_dir={src}",)), _one_worker(), environ)
    assert ran.args == (f"--data_dir={copy}",)
    assert environ["DATA_DIR"] == str(copy)


def _one_worker() -> ClusterLayout:
    return ClusterLayout(workers=("localhost:2000",), nodes=("localhost",))


WARNED_MID_STEP = """
import os, signal, sys
from pathlib import Path
from slurmtf.cli import data
from slurmtf.datasets import stage

def warned(environ):  # Slurm's warning arrives while the step removes the copy
    os.kill(os.getpid(), signal.Signals[sys.argv[1]])
    return Path("/scratch/slurmtf-data-7")

stage.unstage = warned
sys.exit(data.main(["unstage"]))
"""


@pytest.mark.parametrize("warning", ["SIGUSR2", "SIGUSR1"])
def test_the_staging_step_outlives_slurms_warning_signal(warning: str) -> None:
    """``--signal=USR2@S`` reaches every step of the job: the removal of the staged copies
    finishes (its ``unstaged`` event) instead of dying of the signal's default action."""
    done = subprocess.run(
        [sys.executable, "-c", WARNED_MID_STEP, warning], capture_output=True, text=True,
        timeout=60, check=False, env={**os.environ, "SLURMD_NODENAME": "node1"},
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr)
    (event,) = parse_events(done.stdout)
    assert event == {**event, "event": "unstaged", "node": "node1"}
