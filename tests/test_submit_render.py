"""Dry-run rendering: the sbatch script submitit would write, compared with stored files.

Regenerate the stored scripts after an intended change with
``SLURMTF_REGENERATE=1 python -m pytest tests/test_submit_render.py`` and review the diff.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

from slurmtf.cli import submit as submit_cli
from slurmtf.errors import InputError
from slurmtf.spec import jobspec
from slurmtf.spec.jobspec import JobSpec

DATA = Path(__file__).parent / "data" / "submit"
LOGS = "/shared/logs"

CASES: dict[str, JobSpec] = {
    "mnist_2x4_gres": JobSpec(
        kind="model", target="mnist", nodes=2, gpus_per_node=4, time_min=30, log_dir=LOGS
    ),
    "resnet56_gpus_per_node": JobSpec(
        kind="model",
        target="resnet56",
        nodes=4,
        gpus_per_node=8,
        gpu_flag="gpus-per-node",
        time_min=90,
        log_dir=LOGS,
    ),
    "module_gpus_per_task": JobSpec(
        kind="module", target="mypkg.train", gpus_per_node=2, gpu_flag="gpus-per-task", log_dir=LOGS
    ),
    "cpu_all_options": JobSpec(
        kind="command",
        target="bash run.sh",
        nodes=3,
        cpus_per_task=8,
        mem="32G",
        time_min=125,
        partition="batch",
        account="proj42",
        qos="high",
        constraint="skylake&ib",
        exclusive=True,
        setup=("module load cuda/12.2", "source /opt/venv/bin/activate"),
        sbatch_extra=(("mail-type", "END"), ("hint", "nomultithread")),
        max_requeues=0,
        job_name="my job",
        log_dir=LOGS,
        signal="TERM",
        signal_delay_s=300,
    ),
    "ps_jobs_3_nodes": JobSpec(
        kind="command",
        target="python train.py",
        nodes=3,
        time_min=30,
        log_dir=LOGS,
        jobs="chief:1,ps:2,worker:2",
    ),
    "sweep_2x2_array": JobSpec(
        kind="model",
        target="mnist",
        nodes=2,
        log_dir=LOGS,
        sweep=(("learning_rate", ("0.1", "0.01")), ("batch_size", ("32", "64"))),
        array_parallelism=2,
    ),
}


def render(spec: JobSpec) -> str:
    grid = spec.grid
    return jobspec.render_sbatch(spec, "python3", map_count=len(grid) if len(grid) > 1 else None)


@pytest.mark.parametrize("name", sorted(CASES))
def test_script_matches_stored(name: str) -> None:
    text = render(CASES[name])
    path = DATA / f"{name}.sbatch"
    if os.environ.get("SLURMTF_REGENERATE") == "1":
        path.write_text(text)
    assert path.exists(), f"no stored script {path}. HINT: run with SLURMTF_REGENERATE=1"
    assert text == path.read_text()


def test_issue_example_dry_run() -> None:
    out = io.StringIO()
    argv = ["--dry_run", "--model=mnist", "--nodes=2", "--gpus_per_node=4", "--time=30"]
    assert submit_cli.main(argv, out=out) == 0
    text = out.getvalue()
    for line in ("#SBATCH --gres=gpu:4", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4"):
        assert line in text.splitlines()
    assert "--kill-on-bad-exit=1" in text
    assert "-m slurmtf_models.mnist" in text


def test_dry_run_sweep_is_a_four_task_array() -> None:
    out = io.StringIO()
    argv = ["--dry_run", "--model=mnist", "--sweep=learning_rate=0.1,0.01", "--sweep=seed=1,2"]
    assert submit_cli.main(argv, out=out) == 0
    text = out.getvalue()
    assert "#SBATCH --array=0-3%4" in text.splitlines()
    assert text.count("# array task ") == 4
    assert "--learning_rate=0.01 --seed=2" in text


def test_dry_run_passes_model_flags_through() -> None:
    out = io.StringIO()
    argv = ["--dry_run", "--model=resnet20", "--", "--train_steps=5", "--model_dir=/ckpt"]
    assert submit_cli.main(argv, out=out) == 0
    command = next(line for line in out.getvalue().splitlines() if "slurmtf_models.resnet" in line)
    tail = "--resnet_size=20 --preemption_signal=USR2 --train_steps=5 --model_dir=/ckpt"
    assert command.endswith(tail)


@pytest.mark.parametrize(
    ("flag", "line"),
    [
        ("gres", "#SBATCH --gres=gpu:2"),
        ("gpus-per-node", "#SBATCH --gpus-per-node=2"),
        ("gpus-per-task", "#SBATCH --gpus-per-task=1"),
    ],
)
def test_gpu_flag(flag: str, line: str) -> None:
    spec = JobSpec(kind="model", target="mnist", gpus_per_node=2, gpu_flag=flag, log_dir=LOGS)
    lines = render(spec).splitlines()
    assert line in lines
    assert "#SBATCH --ntasks-per-node=2" in lines


def test_no_gpus_means_one_task_per_node() -> None:
    lines = render(JobSpec(kind="model", target="mnist", nodes=3, log_dir=LOGS)).splitlines()
    assert "#SBATCH --ntasks-per-node=1" in lines
    assert not any("gpu" in line for line in lines)


def test_signal_is_configurable() -> None:
    spec = JobSpec(kind="model", target="mnist", signal="TERM", signal_delay_s=60, log_dir=LOGS)
    assert "#SBATCH --signal=TERM@60" in render(spec).splitlines()


@pytest.mark.parametrize(("minutes", "warning"), [(60, 120), (8, 120), (2, 30), (1, 15)])
def test_a_short_time_limit_is_not_warned_at_its_start(minutes: int, warning: int) -> None:
    """The default warning is 120 s before the limit, or a quarter of a shorter job's."""
    spec = JobSpec(kind="model", target="mnist", time_min=minutes, log_dir=LOGS)
    assert f"#SBATCH --signal=USR2@{warning}" in render(spec).splitlines()


def test_a_warning_at_or_before_the_start_is_refused() -> None:
    with pytest.raises(InputError, match=r"--signal_delay_s=120.*--time=2 \(120 s\).*HINT: "):
        JobSpec(kind="model", target="mnist", time_min=2, signal_delay_s=120, log_dir=LOGS)
    out = io.StringIO()
    assert submit_cli.main(["--dry_run", "--model=mnist", "--time=2"], out=out) == 0
    assert "#SBATCH --signal=USR2@30" in out.getvalue()


def test_max_restarts_hands_the_step_to_the_supervisor() -> None:
    out = io.StringIO()
    assert submit_cli.main(["--dry_run", "--model=mnist", "--max_restarts=5"], out=out) == 0
    logs = Path("slurmtf_logs").absolute()
    assert f"-m slurmtf job submitit --log_dir={logs} --max_restarts=5 --" in out.getvalue()
    out = io.StringIO()
    assert submit_cli.main(["--dry_run", "--model=mnist", "--max_requeues=0"], out=out) == 0
    assert "slurmtf job" not in out.getvalue()
    assert "--no-requeue" in out.getvalue()


def test_a_container_prefix_hands_every_job_to_the_supervisor() -> None:
    out = io.StringIO()
    argv = ["--dry_run", "--model=mnist", "--max_requeues=0", "--container_prefix=run it 'a b'"]
    assert submit_cli.main(argv, out=out) == 0
    assert "--max_restarts=0 '--container=run it '\"'\"'a b'\"'\"'' --" in out.getvalue()


def test_a_ps_job_serves_on_every_task_and_runs_the_script_as_it_is_on_the_chief() -> None:
    spec = CASES["ps_jobs_3_nodes"]
    assert spec.num_tasks == 5
    command = jobspec.task_command(spec, {"lr": "0.1"}, "python3", job_id="42", restart=1)
    done = f"--done_file={spec.folder / '42_chief_done.1'}"
    assert command == [
        "python3", "-u", "-m", "slurmtf.serve", done, "--", "python", "train.py", "--lr=0.1",
    ]  # fmt: skip
    module = jobspec.task_command(
        JobSpec(kind="module", target="pkg.train", nodes=3, jobs="chief:1,ps:1,worker"), {}
    )
    assert module[-5:] == ["--", "python3", "-u", "-m", "pkg.train"]
    script = render(spec)
    assert "#SBATCH --ntasks=5\n" in script
    assert "--ntasks-per-node" not in script
    assert "--kill-on-bad-exit=0" in script  # the chief decides; a killed worker is tolerated
    assert "export SLURMTF_JOBS=chief:1,ps:2,worker:2\n" in script


def test_cpus_per_gpu_is_sbatch_s_and_goes_with_gpus_only() -> None:
    """``--cpus_per_gpu`` replaces a site's DefCpuPerGPU; sbatch refuses it beside
    ``--cpus-per-task``, 25.11 and 26.05 beside no GPU (22.05 accepts it and every step then
    fails "Invalid generic resource"): refused here first, naming the flag."""
    spec = JobSpec(kind="model", target="mnist", nodes=2, gpus_per_node=4, cpus_per_gpu=2)
    lines = render(spec).splitlines()
    assert "#SBATCH --cpus-per-gpu=2" in lines
    assert "#SBATCH --ntasks-per-node=4" in lines
    assert not [line for line in lines if "cpus-per-task" in line]
    for kwargs, words in [
        ({"gpus_per_node": 4, "cpus_per_gpu": 0}, "must be at least 1"),
        ({"gpus_per_node": 4, "cpus_per_gpu": 2, "cpus_per_task": 2}, "sbatch refuses both"),
        ({"cpus_per_gpu": 2}, "needs GPUs (--gpus_per_node)"),
    ]:
        with pytest.raises(InputError, match=rf"--cpus_per_gpu=.*{re.escape(words)}.*HINT: "):
            JobSpec(kind="model", target="mnist", nodes=2, **kwargs)  # type: ignore[arg-type]
    out, err = io.StringIO(), io.StringIO()
    argv = ["--dry_run", "--model=mnist", "--gpus_per_node=4", "--sbatch_extra=cpus-per-gpu=2"]
    with contextlib.redirect_stderr(err):
        assert submit_cli.main(argv, out) == 2
    assert "HINT: use --cpus_per_gpu" in err.getvalue()
