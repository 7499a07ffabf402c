"""The submit CLI: validation, exit codes, sweeps, no TensorFlow, fake sbatch, no sbatch."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurmtf.cli import submit as submit_cli
from slurmtf.contracts import parse_preemption_signal, signal_name
from slurmtf.errors import InputError
from slurmtf.spec import jobspec
from slurmtf.spec import values as jobvalues


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--nodes=2"], "--model/--module/--function/--command"),
        (["--model=mnist", "--module=x"], "--model/--module/--function/--command"),
        (["--model=alexnet"], "--model"),
        (["--model=mnist", "--nodes=0"], "--nodes"),
        (["--model=mnist", "--time=soon"], "--time"),
        (["--model=mnist", "--time=0"], "--time"),
        (["--model=mnist", "--mem=lots"], "--mem"),
        (["--model=mnist", "--signal=USR1"], "--signal"),
        (["--model=mnist", "--signal=NOPE"], "--signal"),
        (["--model=mnist", "--sweep=lr"], "--sweep"),
        (["--model=mnist", "--sweep=lr=1,,2"], "--sweep"),
        (["--model=mnist", "--sweep=lr=1", "--sweep=lr=2"], "--sweep"),
        (["--model=mnist", "--sbatch_extra=Bad Key=1"], "--sbatch_extra"),
        (["--model=mnist", "--sbatch_extra=ntasks=3"], "--sbatch_extra"),
        (["--function=nocolon"], "--function"),
        (["--module=not a module"], "--module"),
        (["--command=echo 'open"], "--command"),
        (["--model=mnist", "--max_restarts=-1"], "--max_restarts"),
        (["--model=mnist", "--max_requeues=-1"], "--max_restarts"),  # the former name
        (
            ["--command=python t.py", "--jobs=chief:1,ps:2,boss"],
            "--jobs='chief:1,ps:2,boss': names the unknown role 'boss'",
        ),
        (["--command=python t.py", "--jobs=ps:2,worker"], "--jobs='ps:2,worker': has ps tasks"),
        (["--model=mnist", "--jobs=chief:1,ps:1,worker"], "needs the chief's own script"),
        (["--command=python t.py", "--jobs=chief:1@0,ps@0,worker@1"], "no heterogeneous job"),
        (["--command=python t.py", "--jobs=chief:1,ps:1", "--nodes=3"], "fewer than --nodes=3"),
        (["--command=python t.py", "--jobs=chief:1,ps:2,worker", "--nodes=3"], "at least 4"),
        (["--command=python t.py", "--jobs=chief:1,ps:1,worker", "--cluster=local"], "Slurm only"),
        (["--command=python t.py", "--jobs=chief:1,ps:1,worker:2", "--nodes=2-4"], "minimum"),
    ],
)
def test_usage_errors_exit_2_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert submit_cli.main(["--dry_run", *argv], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert flag in err
    assert "HINT" in err


def test_unknown_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert submit_cli.main(["--model=mnist", "--nodez=2"], out=io.StringIO()) == 2
    assert "nodez" in capsys.readouterr().err


def test_help_exits_0() -> None:
    out = io.StringIO()
    assert submit_cli.main(["--help"], out=out) == 0
    assert "--gpus_per_node" in out.getvalue()


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("30", 30), ("1:30", 2), ("02:00:00", 120), ("1-0", 1440), ("1-2:03", 1563), ("0:0:30", 1)],
)
def test_parse_time(text: str, minutes: int) -> None:
    assert jobvalues.parse_time(text) == minutes


@pytest.mark.parametrize(("text", "name"), [("USR2", "USR2"), ("sigterm", "TERM"), ("12", "USR2")])
def test_parse_signal(text: str, name: str) -> None:
    assert signal_name(parse_preemption_signal(text, "--signal")) == name


def test_sweep_grid_order_and_size() -> None:
    sweep = jobvalues.parse_sweep(["lr=0.1,0.01", "--batch_size=32,64,128"])
    grid = jobvalues.sweep_grid(sweep)
    assert len(grid) == 6
    assert grid[0] == {"lr": "0.1", "batch_size": "32"}
    assert grid[1] == {"lr": "0.1", "batch_size": "64"}
    assert grid[-1] == {"lr": "0.01", "batch_size": "128"}
    assert jobvalues.sweep_grid(()) == [{}]


def test_sweep_values_may_contain_equals_and_spaces_stripped() -> None:
    assert jobvalues.parse_sweep(["opt=a=b, c"]) == (("opt", ("a=b", "c")),)


def test_extra_keys_normalized() -> None:
    pairs = jobvalues.parse_extra(["--mail_type=END", "overcommit"])
    assert pairs == (("mail-type", "END"), ("overcommit", ""))
    with pytest.raises(InputError, match="--log_dir"):
        jobvalues.parse_extra(["output=x"])


def test_spec_round_trips_through_json() -> None:
    spec = jobspec.JobSpec(
        kind="model",
        target="mnist",
        args=("--a=1",),
        setup=("module load x",),
        sbatch_extra=(("comment", "c"),),
        sweep=(("lr", ("1", "2")),),
    )
    assert jobspec.JobSpec.from_json(spec.to_json()) == spec


def test_submit_does_not_import_tensorflow(tmp_path: Path) -> None:
    code = (
        "import sys, io; from slurmtf import submit, watch, launch, local; "
        "from slurmtf.cli import submit as cli; "
        "assert cli.main(['--dry_run', '--model=mnist', '--nodes=2'], out=io.StringIO()) == 0; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, timeout=60)


def fake_slurm(tmp_path: Path, sbatch_body: str) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in (("sbatch", sbatch_body), ("srun", "exit 0")):
        path = bindir / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(0o755)
    return bindir


def test_no_sbatch_is_a_clear_error_with_the_local_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    argv = ["--model=mnist", f"--log_dir={tmp_path / 'logs'}"]
    assert submit_cli.main(argv, out=io.StringIO()) == 1
    err = capsys.readouterr().err
    assert "sbatch is not on PATH" in err
    assert "--cluster=local" in err


def test_submit_prints_job_id_and_log_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = 'cp "$1" "$(dirname "$1")/seen.sh"; echo "Submitted batch job 4242"'
    bindir = fake_slurm(tmp_path, body)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    logs = tmp_path / "my logs"
    out = io.StringIO()
    argv = ["--model=mnist", "--nodes=2", f"--log_dir={logs}", "--", "--train_steps=3"]
    assert submit_cli.main(argv, out=out) == 0
    text = out.getvalue()
    assert "submitted job 4242" in text
    assert f"rank 1: {logs}/4242_1_log.out" in text
    seen = (logs / "seen.sh").read_text()
    assert "#SBATCH --nodes=2" in seen
    assert "--kill-on-bad-exit=1" in seen
    assert (logs / "4242_submitted.pkl").exists()


def test_submit_sweep_is_one_array(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = 'grep -q "#SBATCH --array=0-3%2" "$1" || exit 3; echo "Submitted batch job 77"'
    bindir = fake_slurm(tmp_path, body)
    for name in ("scontrol", "squeue", "sacct"):  # the array is not known yet
        fake = bindir / name
        fake.write_text(
            '#!/bin/bash\necho "slurm_load_jobs error: Invalid job id specified" >&2\nexit 1\n'
        )
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    out = io.StringIO()
    argv = [
        "--model=mnist",
        f"--log_dir={tmp_path}",
        "--sweep=lr=1,2",
        "--sweep=seed=3,4",
        "--array_parallelism=2",
    ]
    assert submit_cli.main(argv, out=out) == 0
    text = out.getvalue()
    assert "job array 77 (4 tasks)" in text
    assert "77_3 {'lr': '2', 'seed': '4'} logs:" in text
    assert f"rank 0: {tmp_path}/77_2_0_log.out" in text
    # The HParams table has every point's parameters before any has run.
    written = json.loads((tmp_path / "77_hparams" / "sweep.json").read_text())
    assert [p["params"] for p in written["points"]] == [
        {"lr": lr, "seed": seed} for lr in ("1", "2") for seed in ("3", "4")
    ]
    assert written["params"] == ["lr", "seed"]


def test_slurm_refusal_is_shown_plainly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    message = "sbatch: error: Batch job submission failed: Invalid partition name specified"
    bindir = fake_slurm(tmp_path, f'echo "{message}" >&2; exit 1')
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    argv = ["--model=mnist", "--partition=nope", f"--log_dir={tmp_path}"]
    assert submit_cli.main(argv, out=io.StringIO()) == 1
    err = capsys.readouterr().err
    assert "sbatch failed (exit 1)" in err
    assert message in err


def test_dashed_flag_spelling_is_accepted_like_sbatch_writes_it() -> None:
    out = io.StringIO()
    argv = ["--dry_run", "--model=mnist", "--nodes=2", "--gpus-per-node=4", "--time=30"]
    assert submit_cli.main(argv, out=out) == 0
    assert "--gres=gpu:4" in out.getvalue()
    # after `--` everything belongs to the model, spelled as given
    out = io.StringIO()
    assert submit_cli.main([*argv, "--", "--train-steps=3"], out=out) == 0
    assert "--train-steps=3" in out.getvalue()
