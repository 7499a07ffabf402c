"""End-to-end: the sandbox itself, the sacct shim, and the resolver under real srun."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from slurmtf.cli.sandbox import main as sandbox_main
from slurmtf.sandbox import Sandbox, daemons
from slurmtf.slurm.release import SlurmRelease
from tests.e2e.conftest import PYTHON, REPO, SlurmSandbox, require_sandbox_prereqs
from tests.helpers.procs import pids_mentioning

pytestmark = pytest.mark.slurm

RESOLVER_LAYOUTS = [
    pytest.param(["-N2", "-n4", "-m", "block"], 4, id="block"),
    pytest.param(["-N2", "-n4", "-m", "cyclic"], 4, id="cyclic"),
    pytest.param(["-N3", "-n5"], 5, id="uneven-N3-n5"),
    pytest.param(["-N3", "-n5", "-m", "cyclic"], 5, id="uneven-N3-n5-cyclic"),
    pytest.param(["-N2", "-n4", "--gpus-per-task=1"], 4, id="gpus-per-task"),
]


@pytest.mark.matrix
def test_all_nodes_idle_with_fake_gpus(slurm_sandbox: SlurmSandbox) -> None:
    assert slurm_sandbox.sandbox.node_states() == {f"node{i}": "idle" for i in (1, 2, 3)}
    show = slurm_sandbox.run(["scontrol", "show", "node", "node2"]).stdout
    assert "Gres=gpu:2" in show
    assert (slurm_sandbox.dir / "dev" / "nvidia1").resolve() == Path("/dev/null")


@pytest.mark.matrix
@pytest.mark.parametrize(("layout", "ntasks"), RESOLVER_LAYOUTS)
def test_resolver_under_srun(slurm_sandbox: SlurmSandbox, layout: list[str], ntasks: int) -> None:
    """Each rank's worker[SLURM_PROCID] is its own node, and every rank sees one list."""
    script = (
        'echo "$SLURM_PROCID $SLURMD_NODENAME ${CUDA_VISIBLE_DEVICES:--}'
        ' $("$0" -m slurmtf.resolver)"'
    )
    done = slurm_sandbox.run(["srun", *layout, "bash", "-c", script, PYTHON], timeout=60)
    rows = [line.split(" ", 3) for line in done.stdout.splitlines() if line.strip()]
    assert len(rows) == ntasks, done.stdout + done.stderr
    workers_seen = set()
    for rank, node, gpus, tf_config_json in rows:
        tf_config = json.loads(tf_config_json)
        workers = tf_config["cluster"]["worker"]
        workers_seen.add(tuple(workers))
        assert tf_config["task"] == {"type": "worker", "index": int(rank)}
        assert workers[int(rank)].rsplit(":", 1)[0] == node, done.stdout
        if "--gpus-per-task=1" in layout:
            assert len(gpus.split(",")) == 1, done.stdout
    assert len(workers_seen) == 1, done.stdout
    (workers,) = workers_seen
    assert len(workers) == ntasks
    assert len(set(workers)) == ntasks  # one address per rank: no port shared on a host


def test_node_names_resolve_inside_jobs_only(slurm_sandbox: SlurmSandbox) -> None:
    done = slurm_sandbox.run(["srun", "-N1", "getent", "hosts", "node3"], timeout=30)
    assert done.stdout.split()[0] == slurm_sandbox.sandbox.config().node_addr(3)
    assert "node3" not in Path("/etc/hosts").read_text()


@pytest.mark.matrix
def test_every_command_is_the_requested_slurm(slurm_sandbox: SlurmSandbox, tmp_path: Path) -> None:
    """The daemons, the client commands (here and inside a job) and `sandbox status` are
    all of the Slurm SLURMTF_SLURM_PREFIX names (Debian's packages without it)."""
    prefix = slurm_sandbox.sandbox.slurm
    daemon = f"{prefix}/sbin/slurmctld" if prefix else "slurmctld"
    want = str(SlurmRelease.parse(subprocess.check_output([daemon, "-V"], text=True)))
    assert str(slurm_sandbox.sandbox.config().release) == want
    config = slurm_sandbox.run(["scontrol", "show", "config"]).stdout
    assert re.search(rf"^SLURM_VERSION\s+=\s+{re.escape(want)}$", config, re.M), config
    script = tmp_path / "which.sbatch"
    script.write_text(
        "#!/bin/bash\nfor c in sbatch srun scontrol squeue sinfo; do command -v $c; done\n"
        "srun -N1 sinfo --version\n"
    )
    out = tmp_path / "which.out"
    job = slurm_sandbox.submit(script, sbatch_args=[f"--output={out}"])
    assert slurm_sandbox.wait(job, 60) == "COMPLETED", slurm_sandbox.logs(job)
    *paths, version = out.read_text().split("\n")[:6]
    assert str(SlurmRelease.parse(version)) == want
    if prefix:
        assert paths == [
            f"{prefix}/bin/{c}" for c in ("sbatch", "srun", "scontrol", "squeue", "sinfo")
        ]
    else:
        assert all(p.startswith("/usr/bin/") for p in paths), paths
    status = slurm_sandbox.run([PYTHON, "-m", "slurmtf.cli", "sandbox", "status",
                                "--dir", str(slurm_sandbox.dir)]).stdout  # fmt: skip
    assert f"slurm {want} ({prefix or 'Debian'}" in status


@pytest.mark.matrix
def test_sacct_shim_reports_finished_jobs(slurm_sandbox: SlurmSandbox, tmp_path: Path) -> None:
    output = f"--output={tmp_path}/%j.out"
    ok = slurm_sandbox.submit("--wrap=srun true", sbatch_args=["-N2", output])
    bad = slurm_sandbox.submit("--wrap=exit 3", sbatch_args=[output])
    assert slurm_sandbox.wait(ok, 60) == "COMPLETED"
    assert slurm_sandbox.wait(bad, 60) == "FAILED"
    out = slurm_sandbox.run(
        ["sacct", "-o", "JobID,State,NodeList", "--parsable2", "-j", ok, "-j", bad]
    )
    lines = out.stdout.splitlines()
    assert lines[0] == "JobID|State|NodeList"
    assert sorted(lines[1:]) == sorted([f"{ok}|COMPLETED|node[1-2]", f"{bad}|FAILED|node1"])


@pytest.mark.matrix
def test_requeue_keeps_the_job_id(slurm_sandbox: SlurmSandbox, tmp_path: Path) -> None:
    """A job that requeues itself once runs again with SLURM_RESTART_COUNT=1."""
    out = tmp_path / "requeue.out"
    script = tmp_path / "requeue.sbatch"
    script.write_text(
        "#!/bin/bash\n#SBATCH --requeue\n"
        f'echo "restart=${{SLURM_RESTART_COUNT:-0}}" >> {out}\n'
        '[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] || scontrol requeue "$SLURM_JOB_ID"\n'
    )
    job = slurm_sandbox.submit(script, sbatch_args=[f"--output={tmp_path}/%j.log"])
    assert slurm_sandbox.wait(job, 90) == "COMPLETED", slurm_sandbox.logs(job)
    assert out.read_text().split() == ["restart=0", "restart=1"]


def test_separate_sandbox_up_down_leaves_nothing(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Start a second sandbox beside the session's, run a job, stop it: nothing remains."""
    require_sandbox_prereqs()
    sbx_dir = tmp_path_factory.mktemp("slurm-updown")
    sandbox = Sandbox(sbx_dir, nodes=2, gpus_per_node=1)
    t0 = time.monotonic()
    try:
        assert (
            sandbox_main(["up", "--dir", str(sbx_dir), "--nodes", "2", "--gpus-per-node", "1"]) == 0
        )
        start_s = time.monotonic() - t0
        assert sandbox.is_up()
        assert sandbox.up() is False  # idempotent: already up
        assert sandbox_main(["status", "--dir", str(sbx_dir)]) == 0
        env = sandbox.env()
        done = sandbox.run(
            [
                "sbatch",
                "--parsable",
                "-N2",
                f"--output={sbx_dir}/%j.out",
                "--wrap",
                "srun sleep 300",
            ]
        )
        job = done.stdout.strip()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if sandbox.run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip() == "RUNNING":
                break
            time.sleep(0.2)
        time.sleep(1)  # let the steps spawn their tasks
        daemon_pids = dict(sandbox.live_daemons())
        namespaces = [
            daemons.mount_ns(pid) for name, pid in daemon_pids.items() if name != "munged"
        ]
        job_pids = daemons.pids_in_namespaces(namespaces, exclude=daemon_pids.values())
        assert job_pids, "no job processes found in the sandbox's namespaces"
        assert env["SLURM_CONF"] == str(sbx_dir / "slurm.conf")
    finally:
        t1 = time.monotonic()
        assert sandbox_main(["down", "--dir", str(sbx_dir)]) == 0
        stop_s = time.monotonic() - t1
    print(f"separate sandbox: up {start_s:.1f}s, down {stop_s:.1f}s")
    for name, pid in daemon_pids.items():
        assert not daemons.alive(pid, str(sbx_dir)), f"{name} (pid {pid}) survived down"
    assert [p for p in job_pids if not daemons.is_zombie(p)] == []
    assert daemons.pids_in_namespaces(namespaces) == []
    assert pids_mentioning(str(sbx_dir)) == []
    assert sandbox_main(["status", "--dir", str(sbx_dir)]) == 3
    assert sandbox_main(["down", "--dir", str(sbx_dir)]) == 0  # down again: harmless


@pytest.mark.matrix
@pytest.mark.parametrize("script", ["mnist.sbatch", "resnet.sbatch"])
def test_job_script_plumbing(slurm_sandbox: SlurmSandbox, tmp_path: Path, script: str) -> None:
    """Model flags and env vars reach every rank; per-rank logs; `--gres=none` works.
    PYTHON echoes its arguments on the ranks; the supervisor (``-m slurmtf``), slurmtf's
    own steps (``-m slurmtf.cli``) and the model lookup (``-c``) get the real one."""
    echo = tmp_path / "echo-python"
    real = f'"-m slurmtf"|"-m slurmtf.cli"|-c*) exec {PYTHON} "$@" ;;'
    echo.write_text(f'#!/bin/sh\ncase "$1 $2" in {real} esac\nexec echo "$@"\n')
    echo.chmod(0o755)
    env = {"PYTHON": str(echo), "MODEL_DIR": str(tmp_path / "m"), "LOG_DIR": str(tmp_path / "l")}
    job = slurm_sandbox.submit(
        REPO / "jobs" / script, "--train_steps=7", "--name=a b",
        sbatch_args=["--gres=none", "--ntasks-per-node=2", f"--output={tmp_path}/%x-%j.out"],
        env=env,
    )  # fmt: skip
    assert slurm_sandbox.wait(job, 60) == "COMPLETED", slurm_sandbox.logs(job)
    model = "models." + script.removesuffix(".sbatch")
    for rank in range(4):
        argv = (tmp_path / "l" / f"rank{rank}.out").read_text().strip()
        assert argv == (
            f"-m {model} --model_dir={tmp_path}/m --export_dir={tmp_path}/m/export "
            "--train_steps=7 --name=a b"
        )
    job_log = next(tmp_path.glob("*.out")).read_text()
    assert "2 node(s) node[" in job_log
    assert "srun exited 0" in job_log


def test_two_sandboxes_preferring_one_port_slice_take_two(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Two running sandboxes whose directories name the same step-port slice: the second
    takes the next free one, so their jobs' ``--resv-ports`` never meet."""
    from slurmtf.sandbox import config as c

    require_sandbox_prereqs()
    root = tmp_path_factory.mktemp("slices")
    first = root / "a"
    second = next(root / f"b{i}" for i in range(1000)
                  if c.resv_slice_of(root / f"b{i}") == c.resv_slice_of(first))  # fmt: skip
    sandboxes = [Sandbox(d, nodes=1, gpus_per_node=0) for d in (first, second)]
    try:
        for sandbox in sandboxes:
            sandbox.up()
        ranges = [s.config().resv_port_range for s in sandboxes]
        assert ranges[1] != ranges[0], ranges
        again = Sandbox(second, nodes=1, gpus_per_node=0)  # a later process reads its state
        assert again.config().resv_port_range == ranges[1]
    finally:
        for sandbox in sandboxes:
            sandbox.down()
