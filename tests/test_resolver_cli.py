"""The resolver CLI: exact TF_CONFIG on stdout, --explain, --export, exit 2 on bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurmtf import cli, resolver
from slurmtf.cli.resolve import main
from slurmtf.resolver import export_tf_config, resolve
from tests.conftest import FakeSlurmEnv

ROOT = Path(__file__).resolve().parents[1]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_prints_exactly_the_tf_config_json(
    fake_slurm_env: FakeSlurmEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_slurm_env.step("node[9-10]", "1(x2)", 1, job_id=1234)
    code, out, err = run([], capsys)
    assert (code, err) == (0, "")
    assert out.endswith("\n")
    assert out.count("\n") == 1
    assert json.loads(out) == {
        "cluster": {"worker": ["node9:15400", "node10:15401"]},
        "task": {"type": "worker", "index": 1},
    }
    assert out == json.dumps(json.loads(out)) + "\n"


def test_flags_override_env(
    fake_slurm_env: FakeSlurmEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_slurm_env.step("n[1-2]", "1(x2)", 0)
    code, out, _ = run(["--port_base", "20000", "--address_template", "{host}-ib"], capsys)
    assert code == 0
    assert json.loads(out)["cluster"]["worker"] == ["n1-ib:20000", "n2-ib:20001"]


def test_explain_marks_this_task(
    fake_slurm_env: FakeSlurmEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_slurm_env.step(
        "n[1-2]", "2(x2)", 2, distribution="cyclic", CUDA_VISIBLE_DEVICES="1", SLURM_STEP_GPUS="0,1"
    )
    code, out, _ = run(["--explain"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert "4 workers on 2 nodes, cyclic distribution" in lines[0]
    assert lines[1].split() == ["rank", "role", "node", "address", "port", "local", "gpus"]
    mine = [line for line in lines if line.startswith("*  ")]
    assert len(mine) == 1
    assert mine[0].split()[1:5] == ["2", "worker:2", "n1", "n1"]
    assert mine[0].split()[-2:] == ["1", "1"]  # local id 1, GPU 1


EXPLAIN_GPUS = [
    # (gpu variables of rank 5 of -N2 --ntasks-per-node=4, GPUs of ranks 0..7, plan line)
    (
        {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_STEP_GPUS": "0,1,2,3"},
        ["-", "-", "-", "-", "0", "1", "2", "3"],
        "CUDA_VISIBLE_DEVICES 0,1,2,3 -> 1 for local task 1 of 4; 1 local replica(s)",
    ),
    (
        {"CUDA_VISIBLE_DEVICES": "1", "SLURM_STEP_GPUS": "1", "SLURM_GPUS_ON_NODE": "4"},
        ["-", "-", "-", "-", "0", "1", "2", "3"],
        "Slurm's per-task binding 1: kept",
    ),
    (
        {"CUDA_VISIBLE_DEVICES": "0,1"},
        ["-", "-", "-", "-", "?", "?", "?", "?"],
        "cannot decide: CUDA_VISIBLE_DEVICES='0,1': is seen by 4 tasks",
    ),
]


@pytest.mark.parametrize(("gpu_vars", "gpus", "plan"), EXPLAIN_GPUS)
def test_explain_shows_the_gpus_of_every_rank_on_the_node(
    fake_slurm_env: FakeSlurmEnv,
    capsys: pytest.CaptureFixture[str],
    gpu_vars: dict[str, str],
    gpus: list[str],
    plan: str,
) -> None:
    fake_slurm_env.step("n[1-2]", "4(x2)", 5, SLURM_LOCALID=1, **gpu_vars)
    code, out, _ = run(["--explain"], capsys)
    assert code == 0
    rows = [line.split() for line in out.splitlines()[2:10]]
    assert [row[-1] for row in rows] == gpus, out
    assert out.splitlines()[-1].startswith(f"gpus: {plan}"), out


def test_explain_says_single_worker_fallback(
    fake_slurm_env: FakeSlurmEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["--explain"], capsys)
    assert code == 0
    assert out.startswith("single local worker (not in a Slurm job")


def test_export_lines_round_trip_through_the_shell(
    fake_slurm_env: FakeSlurmEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_slurm_env.step("n[1-2]", "2(x2)", 3)
    code, out, _ = run(["--export"], capsys)
    assert code == 0
    assert out.startswith("export TF_CONFIG='{")
    bash = shutil.which("bash")
    assert bash is not None
    script = (
        out + 'printf "%s\\n%s\\n%s\\n" "$TF_CONFIG" "$SLURMTF_TASK_INDEX" "$SLURMTF_NUM_WORKERS"'
    )
    done = subprocess.run([bash, "-c", script], capture_output=True, text=True, check=True)
    config, index, count = done.stdout.splitlines()
    assert json.loads(config) == resolve().tf_config()
    assert (index, count) == ("3", "4")


@pytest.mark.parametrize(
    ("changes", "start"),
    [
        ({"SLURM_STEP_NODELIST": "n[3-1]"}, "SLURM_STEP_NODELIST='n[3-1]': "),
        ({"SLURM_PROCID": "nine"}, "SLURM_PROCID='nine': "),
        ({"SLURM_PROCID": "7"}, "SLURM_PROCID='7': "),
        ({"SLURM_STEP_TASKS_PER_NODE": "1,1,1"}, "SLURM_STEP_TASKS_PER_NODE='1,1,1': "),
        ({"SLURM_DISTRIBUTION": "spread"}, "SLURM_DISTRIBUTION='spread': "),
    ],
)
def test_bad_input_exits_2_with_one_line(
    fake_slurm_env: FakeSlurmEnv,
    capsys: pytest.CaptureFixture[str],
    changes: dict[str, str],
    start: str,
) -> None:
    fake_slurm_env.step("n[1-2]", "1(x2)", 0)
    fake_slurm_env.set(**changes)
    code, out, err = run([], capsys)
    assert (code, out) == (2, "")
    assert err.startswith(f"slurmtf resolve: {start}")
    assert err.count("\n") == 1
    assert "HINT:" in err


def test_bad_flag_value_names_the_flag(
    fake_slurm_env: FakeSlurmEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_slurm_env.step("n[1-2]", "1(x2)", 0)
    code, _, err = run(["--port_base", "99"], capsys)
    assert code == 2
    assert err.startswith("slurmtf resolve: --port_base='99': ")
    code, _, err = run(["--address_template", "{x}"], capsys)
    assert code == 2
    assert err.startswith("slurmtf resolve: --address_template='{x}': ")


def test_console_script_dispatches_resolve(
    fake_slurm_env: FakeSlurmEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_slurm_env.step("n[1-2]", "1(x2)", 1)
    assert cli.main(["resolve"]) == 0
    assert json.loads(capsys.readouterr().out)["task"]["index"] == 1


def test_export_tf_config_writes_only_when_asked(fake_slurm_env: FakeSlurmEnv) -> None:
    layout = resolve(FakeSlurmEnv.step_vars("n[1-2]", "1(x2)", 0))
    assert "TF_CONFIG" not in os.environ
    target: dict[str, str] = {}
    value = export_tf_config(layout, target)
    assert target == {"TF_CONFIG": value}
    assert json.loads(value) == layout.tf_config()


def _python(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run Python with only ``env`` (plus PATH and this checkout) in its environment."""
    full = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), **env}
    command = [sys.executable, *args] if args else [sys.executable, "-c", code]
    return subprocess.run(command, capture_output=True, text=True, env=full, cwd=ROOT, check=False)


def test_import_and_cli_never_import_tensorflow() -> None:
    env = FakeSlurmEnv.step_vars("n[1-2]", "1(x2)", 0)
    code = (
        "import sys, slurmtf, slurmtf.cli.resolve\n"
        "assert slurmtf.cli.resolve.main(['--explain']) == 0\n"
        "assert slurmtf.cli.resolve.main([]) == 0\n"
        "print('tensorflow' in sys.modules)\n"
    )
    done = _python(code, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "False"


def test_module_cli_error_has_no_traceback() -> None:
    env = FakeSlurmEnv.step_vars("n[3-1]", "1(x2)", 0)
    done = _python("", env, "-W", "error", "-m", "slurmtf.resolver")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith(
        "slurmtf resolve: SLURM_STEP_NODELIST='n[3-1]': has the reversed range"
    )
    assert done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr


def test_resolver_exports_the_contract() -> None:
    for name in ("resolve", "export_tf_config", "cluster_resolver", "ClusterLayout"):
        assert hasattr(resolver, name)
    import slurmtf

    assert all(hasattr(slurmtf, name) for name in slurmtf.__all__)
    env = FakeSlurmEnv.step_vars("n[1-2]", "1(x2)", 1)
    assert slurmtf.resolve(env).workers == resolver.resolve(env).workers


# ------------------------------------------------------------------ runner


def test_runner_returns_stdout_and_raises_on_failure() -> None:
    from slurmtf.errors import SlurmCommandError
    from slurmtf.slurm.runner import SubprocessRunner, default_runner

    assert default_runner([sys.executable, "-c", "print('hi')"]) == "hi\n"
    assert (
        default_runner([sys.executable, "-c", "import sys; print(sys.stdin.read())"], input="x")
        == "x\n"
    )
    with pytest.raises(SlurmCommandError) as info:
        default_runner([sys.executable, "-c", "import sys; sys.exit('sbatch: error: bad')"])
    assert info.value.returncode == 1
    assert "sbatch: error: bad" in str(info.value)
    assert default_runner([sys.executable, "-c", "raise SystemExit(3)"], check=False) == ""
    with pytest.raises(SlurmCommandError, match="command not found") as info:
        default_runner(["slurmtf-no-such-command"])
    assert info.value.returncode == 127
    with pytest.raises(SlurmCommandError, match="timed out") as info:
        SubprocessRunner(timeout=0.2)([sys.executable, "-c", "import time; time.sleep(5)"])
    assert info.value.returncode == 124


def test_a_fake_runner_fits_the_protocol() -> None:
    from collections.abc import Mapping, Sequence

    from slurmtf.slurm.runner import Runner

    calls: list[list[str]] = []

    def fake(
        args: Sequence[str],
        *,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        check: bool = True,
    ) -> str:
        calls.append(list(args))
        return "node1\nnode2\n"

    runner: Runner = fake
    assert runner(["scontrol", "show", "hostnames", "node[1-2]"]).split() == ["node1", "node2"]
    assert calls == [["scontrol", "show", "hostnames", "node[1-2]"]]
