"""``--worker_hosts``/``--task_index``, the cluster as TensorFlow's official models take it:
``slurmtf resolve --flags``, ``--export``, ``slurmtf run --cluster_flags``, ``submit
--cluster_flags`` and the bundled models' flags (slurmtf/cluster/flags.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from slurmtf.cli import resolve as resolve_cli
from slurmtf.cli.run import parse_target
from slurmtf.cluster import flags as cf
from slurmtf.cluster.layout import ClusterLayout
from slurmtf.errors import InputError, SlurmtfError
from slurmtf.resolver import export_lines, resolve
from slurmtf.runtime.rank.script import Target, task_target
from slurmtf.spec.jobspec import JobSpec, task_command
from tests.conftest import FakeSlurmEnv

STEP = {"nodelist": "node[1-2]", "tasks_per_node": "2(x2)", "job_id": 77}
SLURMS = "node1:19700,node1:19701,node2:19702,node2:19703"


def _layout(procid: int = 2, **extra: object) -> ClusterLayout:
    return resolve(FakeSlurmEnv.step_vars(procid=procid, **STEP, **extra))  # type: ignore[arg-type]


def test_a_step_as_the_two_flags() -> None:
    layout = _layout()
    assert cf.worker_hosts(layout) == SLURMS
    assert cf.cluster_flags(layout) == [f"--worker_hosts={SLURMS}", "--task_index=2"]
    assert cf.cluster_flags(_layout(SLURMTF_JOBS="chief:1,worker"))[1] == "--task_index=2"


def test_resolve_flags_and_export(
    fake_slurm_env: FakeSlurmEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_slurm_env.step(procid=3, **STEP)  # type: ignore[arg-type]
    assert resolve_cli.main(["--flags"]) == 0
    assert shlex.split(capsys.readouterr().out) == [f"--worker_hosts={SLURMS}", "--task_index=3"]
    assert f"export SLURMTF_WORKER_HOSTS={SLURMS}" in export_lines(_layout()).splitlines()


def test_roles_the_flags_cannot_name_are_refused(
    fake_slurm_env: FakeSlurmEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_slurm_env.step(procid=0, SLURMTF_JOBS="chief:1,ps:1,worker", **STEP)  # type: ignore[arg-type]
    assert resolve_cli.main(["--flags"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("slurmtf resolve: SLURMTF_JOBS='chief:1,ps:1,worker:2': ")
    assert "HINT: read TF_CONFIG" in err
    assert "\n" not in err
    assert "SLURMTF_WORKER_HOSTS" not in export_lines(_layout(SLURMTF_JOBS="chief:1,ps:1,worker"))
    with pytest.raises(InputError):
        cf.worker_hosts(_layout(SLURMTF_JOBS="worker:2,chief:1,worker"))


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("a:1", "has port 1, outside 1024..65535"),
        ("a", "has 'a', which is not host:port"),
        ("a:12345,", "has '', which is not host:port"),
        ("a:x", "has 'a:x', which is not host:port"),
        (":12345", "has ':12345', which is not host:port"),
        ("a b:12345", "has 'a b:12345', which is not host:port"),
        ("a:70000", "has port 70000, outside 1024..65535"),
        ("a:2000,a:2000", "names a:2000 twice"),
    ],
)
def test_bad_worker_hosts_are_one_line(text: str, said: str) -> None:
    with pytest.raises(InputError) as info:
        cf.parse_worker_hosts(text)
    message = str(info.value)
    assert message.startswith(f"--worker_hosts={text!r}: {said}"), message
    assert "HINT: " in message


def test_outside_slurm_the_flags_are_the_cluster(fake_slurm_env: FakeSlurmEnv) -> None:
    local = resolve()
    assert cf.apply_cluster_flags(local, None) is local
    layout = cf.apply_cluster_flags(local, "h1:2000, h2:2001,h1:2002", 2)
    assert layout.workers == ("h1:2000", "h2:2001", "h1:2002")
    assert (layout.task_index, layout.node, layout.port, layout.local_id) == (2, "h1", 2002, 1)
    assert layout.tf_config()["task"] == {"type": "worker", "index": 2}
    assert not layout.in_slurm
    assert not layout.is_single_worker
    one = cf.apply_cluster_flags(local, "h1:2000")  # one host needs no index
    assert one.is_single_worker
    assert one.task_index == 0


@pytest.mark.parametrize(
    ("hosts", "index", "name", "said"),
    [
        ("h1:2000,h2:2000", -1, "--task_index", "is needed with 2 --worker_hosts"),
        ("h1:2000,h2:2000", 2, "--task_index", "is outside 0..1 (2 --worker_hosts)"),
        (None, 1, "--task_index", "needs --worker_hosts outside a Slurm job"),
    ],
)
def test_outside_slurm_bad_flags_are_one_line(
    fake_slurm_env: FakeSlurmEnv, hosts: str | None, index: int, name: str, said: str
) -> None:
    with pytest.raises(InputError) as info:
        cf.apply_cluster_flags(resolve(), hosts, index)
    assert str(info.value).startswith(f"{name}={index!r}: {said}. HINT: ")


def test_outside_slurm_roles_and_flags_do_not_mix(fake_slurm_env: FakeSlurmEnv) -> None:
    fake_slurm_env.set(SLURMTF_JOBS="chief:1")
    with pytest.raises(InputError, match=r"^SLURMTF_JOBS='chief:1': gives roles"):
        cf.apply_cluster_flags(resolve(), "h1:2000,h2:2000", 0)


def test_inside_slurm_the_flags_must_agree() -> None:
    layout = _layout()
    assert cf.apply_cluster_flags(layout, SLURMS, 2) is layout
    assert cf.apply_cluster_flags(layout, None, 2) is layout
    with pytest.raises(InputError) as info:
        cf.apply_cluster_flags(layout, "a:2000,b:2000,c:2000,d:2000", 2)
    message = str(info.value)
    assert message.startswith("--worker_hosts='a:2000,b:2000,c:2000,d:2000': disagrees with ")
    assert f"Slurm's workers {SLURMS!r} (from SLURM_STEP_NODELIST)" in message
    with pytest.raises(InputError, match=r"^--task_index=1: disagrees with Slurm's rank 2 "):
        cf.apply_cluster_flags(layout, SLURMS, 1)


def test_run_appends_the_flags_after_the_scripts_own(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    target = parse_target(["--cluster_flags", str(script), "--epochs=2"])
    assert target == Target(str(script), ("--epochs=2",), cluster_flags=True)
    assert parse_target(["--cluster-flags", "-m", "pkg.train"]).cluster_flags
    assert not parse_target([str(script), "--cluster_flags"]).cluster_flags  # the script's
    ran = task_target(target, _layout(), {})
    assert ran.args == ("--epochs=2", f"--worker_hosts={SLURMS}", "--task_index=2")
    assert task_target(Target(str(script), ("--a",)), _layout(), {}).args == ("--a",)


def test_submit_passes_the_switch_to_the_launcher() -> None:
    command = JobSpec(kind="command", target="python -u t.py --a", cluster_flags=True)
    words = task_command(command, {})
    assert words[:6] == ["python", "-u", "-m", "slurmtf.run", "--cluster_flags", "t.py"]
    module = task_command(JobSpec(kind="module", target="pkg.t", cluster_flags=True), {})
    assert module[3:7] == ["slurmtf.run", "--cluster_flags", "-m", "pkg.t"]
    assert "--cluster_flags" not in task_command(JobSpec(kind="module", target="pkg.t"), {})


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"kind": "model", "target": "mnist"}, "not --model=mnist. HINT: leave it out"),
        ({"kind": "command", "target": "bash t.sh"}, "not --command=bash t.sh. HINT: give"),
        ({"kind": "function", "target": "p:f"}, "not --function=p:f. HINT: give"),
        (
            {"kind": "command", "target": "python t.py", "jobs": "chief:1,ps:1,worker", "nodes": 3},
            "not --jobs=chief:1,ps:1,worker. HINT: leave it out: a ps job's roles",
        ),
    ],
)
def test_submit_refuses_the_switch_where_no_script_takes_it(
    fields: dict[str, object], said: str
) -> None:
    with pytest.raises(SlurmtfError) as info:
        JobSpec(cluster_flags=True, **fields)  # type: ignore[arg-type]
    assert str(info.value).startswith("--cluster_flags=True: appends --worker_hosts/--task_index")
    assert said in str(info.value)
