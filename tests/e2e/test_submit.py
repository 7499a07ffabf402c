"""``python -m slurmtf.submit`` and ``slurmtf status|logs|cancel`` on the local Slurm sandbox."""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from slurmtf.cluster.ports import free_port_base
from tests.e2e.conftest import SlurmSandbox

PY = sys.executable


def submit(sbx: SlurmSandbox, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {"SLURMTF_PORT_BASE": str(free_port_base(8))}  # sbatch exports it to the job
    return sbx.run([PY, "-m", "slurmtf.submit", *args], timeout=timeout, check=False, env=env)


def job_id(stdout: str) -> str:
    match = re.search(r"submitted (?:job|job array) (\d+)", stdout)
    assert match, stdout
    return match.group(1)


def events(path: Path, name: str) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        if line.startswith("{") and f'"event": "{name}"' in line:
            out.append(json.loads(line))
    return out


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise TimeoutError(what)


# Each point prints its flags and reports an eval accuracy of seed/10 + lr as event
# lines and as a TensorBoard scalar in MODEL_DIR/eval (which submit exports); the point
# lr=0.01, seed=2 fails with its own error instead.
_POINT = (
    "import json, os, sys; from pathlib import Path; "
    "p = dict(a[2:].split('=') for a in sys.argv[1:]); print(sys.argv[1:]); "
    "assert (p['lr'], p['seed']) != ('0.01', '2'), 'diverged at lr 0.01'; "
    "acc = int(p['seed']) / 10 + float(p['lr']); "
    "from slurmtf.monitor.hparams import write_events; "
    "from tensorboard.plugins.scalar.summary_v2 import scalar_pb; "
    "write_events(Path(os.environ['MODEL_DIR']) / 'eval', [(scalar_pb('accuracy', acc), 2)]); "
    "print(json.dumps({'event': 'eval', 'step': 2, 'loss': 1 - acc, 'accuracy': acc})); "
    "print(json.dumps({'event': 'done', 'step': 2}))"
)


@pytest.mark.slurm
def test_sweep_is_a_four_task_array(slurm_sandbox: SlurmSandbox, tmp_path: Path) -> None:
    done = submit(
        slurm_sandbox,
        f"--command=python3 -c {shlex.quote(_POINT)}",
        "--sweep=lr=0.1,0.01",
        "--sweep=seed=1,2",
        "--array_parallelism=2",
        "--time=2",
        f"--log_dir={tmp_path}",
        "--wait",
    )
    assert done.returncode == 1, done.stdout + done.stderr  # the failed point's status
    jid = job_id(done.stdout)
    seen = []
    for task in range(4):
        (launch,) = events(tmp_path / f"{jid}_{task}_0_log.out", "launch")
        seen.append(launch["params"])
        assert (
            f"['--lr={launch['params']['lr']}', '--seed={launch['params']['seed']}']"
            in (tmp_path / f"{jid}_{task}_0_log.out").read_text()
        )
    assert seen == [
        {"lr": "0.1", "seed": "1"},
        {"lr": "0.1", "seed": "2"},
        {"lr": "0.01", "seed": "1"},
        {"lr": "0.01", "seed": "2"},
    ]
    # The results table, by job id alone, from another directory: best accuracy first,
    # the failed point last with its error.
    cli = [PY, "-m", "slurmtf.cli"]
    table = slurm_sandbox.run([*cli, "status", jid, "--sort=accuracy"], cwd=tmp_path).stdout
    lines = table.splitlines()
    assert lines[0] == f"sweep {jid}: 4 points, 4 finished", table
    assert lines[1].split()[:5] == ["task", "lr", "seed", "state", "restarts"], table
    order = [line.split()[:3] for line in lines[2:] if line.startswith(jid)]
    assert order == [
        [f"{jid}_1", "0.1", "2"],
        [f"{jid}_0", "0.1", "1"],
        [f"{jid}_2", "0.01", "1"],
        [f"{jid}_3", "0.01", "2"],
    ], table
    assert "0.3000" in lines[2], table
    assert "FAILED" in lines[5], table
    assert "AssertionError: diverged at lr 0.01" in lines[6], table
    text = slurm_sandbox.run([*cli, "sweep", jid, "--csv"], cwd=tmp_path).stdout
    parsed = {row["task"]: row for row in csv.DictReader(io.StringIO(text))}
    assert float(parsed[f"{jid}_2"]["accuracy"]) == pytest.approx(0.11)
    assert parsed[f"{jid}_3"]["accuracy"] == ""
    assert "diverged" in parsed[f"{jid}_3"]["error"]
    assert parsed[f"{jid}_0"]["logs"] == str(tmp_path / f"{jid}_0_0_log.out")
    check_tensorboard(slurm_sandbox, jid, tmp_path)


def check_tensorboard(sbx: SlurmSandbox, jid: str, tmp_path: Path) -> None:
    """``slurmtf tensorboard`` for the finished sweep and for one of its tasks as a job:
    each point's run named by its parameters, its scalar, the HParams table's 4 rows
    (through TensorBoard's data API and in headless Chromium, whose screenshot is kept)."""
    from tests.helpers import tensorboard_page as page
    from tests.helpers.chromium import Browser

    with page.served([jid], cwd=tmp_path, env=sbx.env) as (base, lines):
        assert lines[0].startswith("slurmtf: TensorBoard over 4 run(s): "), lines
        assert page.scalars(base, "lr=0.1 seed=2/eval", "accuracy") == [pytest.approx(0.3)]
        rows = page.hparams_rows(base, 4)
        found = {(r["hparams"]["lr"], r["hparams"]["seed"]): r["metrics"] for r in rows}
        assert set(found) == {(lr, seed) for lr in (0.1, 0.01) for seed in (1.0, 2.0)}, rows
        assert found[(0.1, 2.0)]["accuracy"] == pytest.approx(0.3)
        assert "accuracy" not in found[(0.01, 2.0)]  # the failed point: its parameters only
        with Browser(tmp_path / "profile") as browser:
            tab = browser.open(f"{base}/#hparams")
            browser.wait_for(tab, [f"{jid}_{t}" for t in range(4)] + ["lr", "seed"])
            page.keep_screenshot(browser.screenshot(tab, tmp_path / "tensorboard-sweep.png"))
    with page.served([f"{jid}_1"], cwd=tmp_path, env=sbx.env) as (base, lines):
        assert lines[0] == f"slurmtf: TensorBoard over 1 run(s): {jid}_1\n", lines
        assert page.scalars(base, f"{jid}_1/eval", "accuracy") == [pytest.approx(0.3)]


@pytest.mark.slurm
def test_stage_data_gives_each_node_its_verified_copy(
    slurm_sandbox: SlurmSandbox, tmp_path: Path
) -> None:
    from tests.helpers.datafiles import with_manifest, write_mnist

    data = with_manifest(write_mnist(tmp_path / "shared" / "mnist", n_train=8, n_eval=8))
    read = (
        "import os, sys; from slurmtf.datasets.stage import resolve_data_dir; "
        "print('READ', resolve_data_dir(sys.argv[1].split('=', 1)[1], os.environ))"
    )
    done = submit(
        slurm_sandbox, f"--command=python3 -c {shlex.quote(read)}", "--nodes=2", "--time=2",
        "--stage_data", f"--log_dir={tmp_path}", "--wait", "--", f"--data_dir={data}",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    jid = job_id(done.stdout)
    scratch = slurm_sandbox.dir / "scratch"
    for rank in (0, 1):
        (node,) = {e["node"] for e in events(tmp_path / f"{jid}_{rank}_log.out", "launch")}
        copy = scratch / node / f"slurmtf-data-{jid}" / "mnist"
        assert f"READ {copy}\n" in (tmp_path / f"{jid}_{rank}_log.out").read_text()
    assert not list(scratch.glob(f"*/slurmtf-data-{jid}")), "staged copies left behind"


@pytest.mark.matrix
@pytest.mark.slurm
def test_cancel_and_status(slurm_sandbox: SlurmSandbox, tmp_path: Path) -> None:
    done = submit(slurm_sandbox, "--command=sleep 300", "--time=5", f"--log_dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    jid = job_id(done.stdout)
    wait_for(lambda: slurm_sandbox.state(jid) == "RUNNING", 60, f"job {jid} never ran")
    cli = [PY, "-m", "slurmtf.cli"]
    status = slurm_sandbox.run([*cli, "status", jid])
    assert "RUNNING" in status.stdout
    slurm_sandbox.run([*cli, "cancel", jid])
    assert slurm_sandbox.wait(jid, timeout=60) == "CANCELLED"
    assert "CANCELLED" in slurm_sandbox.run([*cli, "status", jid]).stdout


@pytest.mark.matrix
@pytest.mark.slurm
def test_failed_rank_stops_the_others_and_wait_returns_its_status(
    slurm_sandbox: SlurmSandbox, tmp_path: Path
) -> None:
    start = time.monotonic()
    done = submit(
        slurm_sandbox,
        "--command=bash -c 'if [ $SLURM_PROCID = 1 ]; then exit 3; fi; sleep 300'",
        "--nodes=2",
        "--time=5",
        f"--log_dir={tmp_path}",
        "--wait",
    )
    assert time.monotonic() - start < 90, "rank 0 idled after rank 1 failed"
    assert done.returncode == 3, done.stdout + done.stderr
    jid = job_id(done.stdout)
    assert events(tmp_path / f"{jid}_1_log.out", "exit")[-1]["status"] == 3


@pytest.mark.slurm
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus_per_node=4"], "Requested node configuration is not available"),
        (["--partition=nosuchpart"], "Invalid partition name specified"),
    ],
)
def test_impossible_requests_show_slurms_message(
    slurm_sandbox: SlurmSandbox, tmp_path: Path, args: list[str], message: str
) -> None:
    done = submit(slurm_sandbox, "--command=true", f"--log_dir={tmp_path}", *args)
    assert done.returncode == 1
    assert message in done.stderr
    assert "sbatch failed" in done.stderr


@pytest.mark.slurm
def test_hostile_job_name_and_log_dir_round_trip(
    slurm_sandbox: SlurmSandbox, tmp_path: Path
) -> None:
    name = 'it\'s a "job"; $(touch PWNED) `x` & y'
    logs = tmp_path / "logs with 'quotes'; $(touch PWNED) & spaces"
    done = submit(
        slurm_sandbox,
        "--command=true",
        f"--job_name={name}",
        f"--log_dir={logs}",
        '--setup=echo "setup ran; $((6*7))" >&2',
        "--time=2",
        "--wait",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    jid = job_id(done.stdout)
    show = slurm_sandbox.run(["scontrol", "-o", "show", "job", jid]).stdout
    assert f"JobName={name} " in show
    assert "setup ran; 42" in (logs / f"{jid}_0_log.err").read_text()
    assert not list(tmp_path.rglob("PWNED"))
    assert not list(Path.cwd().glob("PWNED"))


@pytest.mark.slurm
@pytest.mark.tf
@pytest.mark.slow
def test_preempted_job_requeues_and_resumes_to_the_same_step(
    slurm_sandbox: SlurmSandbox, tmp_path: Path
) -> None:
    steps = 150
    model = [
        f"--train_steps={steps}",
        "--log_every=10",
        "--eval_steps=1",
    ]
    common = ["--model=mnist", "--nodes=2", "--time=10", "--max_restarts=2"]
    done = submit(slurm_sandbox, *common, f"--log_dir={tmp_path}", "--", *model)
    assert done.returncode == 0, done.stderr
    jid = job_id(done.stdout)
    rank0 = tmp_path / f"{jid}_0_log.out"
    rank0_err = tmp_path / f"{jid}_0_log.err"
    wait_for(
        lambda: rank0_err.exists() and re.search(r"rank0 I step \d+/", rank0_err.read_text()),
        150,
        f"job {jid} made no progress",
    )
    # What Slurm does before the time limit (--signal=USR2@...), now.
    slurm_sandbox.run(["scancel", "--signal=USR2", jid])
    assert slurm_sandbox.wait(jid, timeout=240) == "COMPLETED", slurm_sandbox.logs(jid)
    # One requeue, by the job script (slurmtf/job.sh), none by the launcher of rank 0.
    assert f"preempted after saving a checkpoint: requeueing job {jid}" in rank0.read_text()
    assert not events(rank0, "requeue")
    assert "Restarts=1 " in slurm_sandbox.run(["scontrol", "show", "job", jid]).stdout
    first, last = events(rank0, "done")[0], events(rank0, "done")[-1]
    assert first["preempted"] is True
    assert first["step"] < steps
    assert last["restart_count"] == 1
    assert last["start_step"] > 0
    assert last["step"] == steps
    assert events(rank0, "launch")[-1]["restart_count"] == 1
