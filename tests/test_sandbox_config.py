"""Fast unit tests of the sandbox's pure parts: file rendering, the sacct shim, PIDs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmtf.cluster import ports
from slurmtf.errors import InputError
from slurmtf.sandbox import Sandbox, daemons, sacct
from slurmtf.sandbox import config as c
from slurmtf.sandbox.config import SandboxConfig
from tests.helpers.procs import pids_mentioning

DATA = Path(__file__).parent / "data" / "sandbox"
GOLDEN = SandboxConfig(dir=Path("/srv/sbx"), nodes=3, gpus_per_node=2, ctld_port=20000)


def _golden(name: str, text: str) -> None:
    """Compare with tests/data/sandbox/NAME; SLURMTF_REGENERATE=1 rewrites the stored file."""
    path = DATA / name
    if os.environ.get("SLURMTF_REGENERATE") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"regenerate with SLURMTF_REGENERATE=1 if intended: {path}"


def test_slurm_conf_matches_stored() -> None:
    _golden("slurm.conf", c.render_slurm_conf(GOLDEN))


def test_gres_conf_matches_stored() -> None:
    _golden("gres.conf", c.render_gres_conf(GOLDEN))


@pytest.mark.parametrize(
    ("gpus", "line"),
    [
        (0, None),
        (1, "Name=gpu File=/srv/sbx/dev/nvidia0"),
        (4, "Name=gpu File=/srv/sbx/dev/nvidia[0-3]"),
    ],
)
def test_gres_lines(gpus: int, line: str | None) -> None:
    cfg = SandboxConfig(dir=Path("/srv/sbx"), nodes=1, gpus_per_node=gpus)
    gres = c.render_gres_conf(cfg).splitlines()
    conf = c.render_slurm_conf(cfg)
    assert "AutoDetect=off" in gres
    if line is None:
        assert len(gres) == 2
        assert "GresTypes" not in conf
        assert "Gres=" not in conf
    else:
        assert gres[-1] == line
        assert f"Gres=gpu:{gpus}" in conf
    assert [p.name for p in c.gpu_device_paths(cfg)] == [f"nvidia{i}" for i in range(gpus)]


def test_settings_that_matter() -> None:
    conf = c.render_slurm_conf(GOLDEN)
    for setting in [
        "cred_expire=10", "EnforcePartLimits=ALL", "ReturnToService=2", "KillWait=5",
        "SlurmdParameters=config_overrides", "JobRequeue=1", f"MinJobAge={c.MIN_JOB_AGE_S}",
        "SchedulerParameters=batch_sched_delay=0,sched_interval=5,bf_interval=1",
        "SlurmdSpoolDir=/srv/sbx/spool/%n",
        "SlurmdPidFile=/srv/sbx/run/slurmd-%n.pid", "SlurmdLogFile=/srv/sbx/log/slurmd-%n.log",
    ]:  # fmt: skip
        assert setting in conf
    ports = [line.rsplit("Port=", 1)[1] for line in conf.splitlines() if " Port=" in line]
    assert ports == ["20001", "20002", "20003"]


@pytest.mark.parametrize("seconds", [5, 10, 120, 3600])
def test_cred_expire_reaches_auth_info(seconds: int) -> None:
    cfg = SandboxConfig(dir=Path("/srv/sbx"), nodes=1, cred_expire=seconds)
    auth = [line for line in c.render_slurm_conf(cfg).splitlines() if line.startswith("AuthInfo")]
    assert auth == [f"AuthInfo=socket=/srv/sbx/munge/munge.socket,cred_expire={seconds}"]


def test_cred_expire_defaults_to_the_sandbox_s_ten() -> None:
    assert SandboxConfig(dir=Path("/srv/sbx")).cred_expire == c.DEFAULT_CRED_EXPIRE_S == 10
    assert c.parse_cred_expire(" 120 ") == c.SLURM_CRED_EXPIRE_S


@pytest.mark.parametrize("text", ["", "abc", "1.5", "0", "-120", "4", "3601"])
def test_a_bad_cred_expire_names_the_flag_and_value(text: str) -> None:
    with pytest.raises(InputError, match="HINT: ") as info:
        c.parse_cred_expire(text)
    assert info.value.name == "--cred_expire"
    assert text in str(info.value).split(":", 1)[0]  # the value as typed, before the problem
    assert "\n" not in str(info.value)


def test_distinct_dirs_get_distinct_names_ports_and_job_ids() -> None:
    dirs = [Path(f"/tmp/sbx{i}") for i in range(50)]
    assert len({c.cluster_name_for(d) for d in dirs}) == 50
    assert len({c.first_job_id(d) for d in dirs}) > 40
    assert len({c.first_job_id(d) % 200 for d in dirs}) > 20  # distinct port slots
    for d in dirs:
        base = c.preferred_port_base(d, 4)
        assert c.PORT_RANGE[0] <= base
        assert base + c.MAX_NODES < c.PORT_RANGE[1]
        assert c.cluster_name_for(d) == c.cluster_name_for(Path(str(d)))
        assert len(c.cluster_name_for(d)) <= 16


def test_no_job_of_a_sandbox_can_take_a_port_of_its_daemons() -> None:
    # A 16-node sandbox once put its slurmd on 22795..22811 and its job 426108 derived
    # 22800..22807 for its 8 ranks: every rank failed with "address in use".
    for d in [Path(f"/tmp/pytest-of-root/pytest-{i}/wide0") for i in range(200)]:
        daemon_ports = set(range(c.preferred_port_base(d, 17), c.preferred_port_base(d, 17) + 17))
        for job_id in range(c.first_job_id(d), c.first_job_id(d) + 50):
            for ntasks in (1, 2, 8, 64):
                base = ports.derive_port_base(job_id, ntasks)
                assert daemon_ports.isdisjoint(range(base, base + ntasks)), (d, job_id)


def test_daemon_job_and_local_step_port_ranges_are_apart() -> None:
    daemons_high = c.PORT_RANGE[1]
    local_low, local_high = ports.LOCAL_PORT_RANGE
    job_ports = range(ports.DEFAULT_PORT, ports.WINDOW_HIGH)
    assert daemons_high <= job_ports.start
    assert local_low >= job_ports.stop
    assert local_low > 60999  # Linux's default ephemeral ports end there
    assert local_high <= ports.PORT_MAX


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"dir": Path("rel/dir")}, "--dir"),
        ({"dir": Path("/tmp/a b")}, "--dir"),
        ({"dir": Path("/tmp/a#b")}, "--dir"),
        ({"dir": Path("/tmp/x"), "nodes": 0}, "--nodes"),
        ({"dir": Path("/tmp/x"), "nodes": c.MAX_NODES + 1}, "--nodes"),
        ({"dir": Path("/tmp/x"), "gpus_per_node": -1}, "--gpus_per_node"),
        ({"dir": Path("/tmp/x"), "gpus_per_node": 4, "cpus_per_node": 2}, "--cpus_per_node"),
        ({"dir": Path("/tmp/x"), "cpus_per_node": 257}, "--cpus_per_node"),
        (
            {"dir": Path("/tmp/x"), "select_type_parameters": "CR_Socket"},
            "--select_type_parameters",
        ),
        ({"dir": Path("/tmp/x"), "def_cpu_per_gpu": -1}, "--def_cpu_per_gpu"),
        ({"dir": Path("/tmp/x"), "def_cpu_per_gpu": 5}, "--def_cpu_per_gpu"),  # 8 CPUs, 2 GPUs
        ({"dir": Path("/tmp/x"), "gpus_per_node": 0, "def_cpu_per_gpu": 1}, "--def_cpu_per_gpu"),
        ({"dir": Path("/tmp/x"), "threads_per_core": 3}, "--threads_per_core"),
        ({"dir": Path("/tmp/x"), "cpus_per_node": 6, "threads_per_core": 4}, "--threads_per_core"),
        ({"dir": Path("/tmp/x"), "nodes": 2, "slurmd_ports": (1,)}, "slurmd_ports"),
        ({"dir": Path("/tmp/x"), "cred_expire": 0}, "--cred_expire"),
        ({"dir": Path("/tmp/x"), "cred_expire": "120"}, "--cred_expire"),
    ],
)
def test_bad_values_name_the_flag(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(InputError, match="HINT") as info:
        SandboxConfig(**kwargs)  # type: ignore[arg-type]
    assert info.value.name == name


def test_hosts_and_env() -> None:
    assert c.render_hosts("127.0.0.1 localhost", ["node1", "node2"]) == (
        "127.0.0.1 localhost\n# slurmtf sandbox nodes\n127.0.0.1 node1 node2\n"
    )
    assert c.render_hosts("", ["node1"]).endswith("127.0.0.1 node1\n")
    assert c.render_env(GOLDEN) == (
        'export SLURM_CONF=/srv/sbx/slurm.conf\nexport PATH=/srv/sbx/bin:"$PATH"\n'
    )
    shim = c.render_sacct_shim("/usr/bin/python3", Path("/srv/sbx"))
    assert shim.startswith("#!/bin/sh\n")
    assert "SLURMTF_SANDBOX_DIR=/srv/sbx exec /usr/bin/python3 -m slurmtf.sandbox.sacct" in shim


SQUEUE = sacct._SEP.join(
    ["565001", "565001", "wrap", "COMPLETED", "node[1-2]", "debug", "2", "0:01", "root", "None"]
)
SQUEUE_ARRAY = sacct._SEP.join(
    ["565003_1", "565004", "arr", "RUNNING", "node3", "debug", "1", "0:05", "root", "None"]
)
JOBCOMP = (
    "JobId=565000 UserId=root(0) GroupId=root(0) Name=bash JobState=CANCELLED Partition=debug "
    "NodeList=node[1-3] NodeCnt=3 ExitCode=0:15\n"
    "JobId=565001 UserId=root(0) Name=wrap JobState=REQUEUED NodeList=node1 ExitCode=0:0\n"
    "garbage line\n"
)


def test_sacct_answers_submitit() -> None:
    from submitit.slurm.slurm import SlurmInfoWatcher

    live = sacct.parse_squeue(SQUEUE + "\n" + SQUEUE_ARRAY + "\nshort\n")
    finished = sacct.parse_jobcomp(JOBCOMP)
    assert [r["JobID"] for r in live] == ["565001", "565003_1"]
    assert [r["State"] for r in finished] == ["CANCELLED", "REQUEUED"]
    chosen = sacct.select(live, finished, ["565000", "565001", "565003"])
    text = sacct.render(chosen, ["JobID", "State", "NodeList"], parsable="2", header=True)
    info = SlurmInfoWatcher().read_info(text)
    assert info["565000"]["State"] == "CANCELLED"
    assert info["565001"]["State"] == "COMPLETED"  # squeue (live) wins over the log
    assert info["565001"]["NodeList"] == "node[1-2]"
    assert info["565003_1"]["State"] == "RUNNING"
    assert sacct.select(live, finished, ["999"]) == []


def test_sacct_render_modes() -> None:
    rows = [{"JobID": "1", "State": "PENDING"}]
    assert sacct.render(rows, ["JobID", "State"], parsable="1", header=False) == "1|PENDING|\n"
    columns = sacct.render(rows, ["JobID", "State"], parsable="", header=True)
    assert columns.splitlines()[1].split() == ["1", "PENDING"]


def test_sacct_rejects_unknown_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert sacct.main(["-o", "JobID,Bogus", "-P"]) == 1
    assert "Bogus" in capsys.readouterr().err


def test_daemon_start_and_stop_by_pid(tmp_path: Path) -> None:
    marker = str(tmp_path)
    argv = [sys.executable, "-c", "import time; time.sleep(60)", marker]
    pid = daemons.start(argv, tmp_path / "out.log", dict(os.environ))
    assert daemons.alive(pid, marker)
    assert not daemons.alive(pid, marker + "-other")  # a reused PID is not ours
    assert pid in pids_mentioning(marker)
    assert daemons.stop({pid: marker}, timeout=5) == []
    assert not daemons.alive(pid, marker)
    deadline = time.monotonic() + 5  # a process in its exit, read from /proc under load
    while pids_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids_mentioning(marker) == []


def test_port_free_sees_a_listener() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert not ports.port_free(sock.getsockname()[1])


def test_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("\n".join(str(i) for i in range(30)))
    assert daemons.log_tail(log, 3) == "27\n28\n29"
    assert "no log" in daemons.log_tail(tmp_path / "missing")
    assert subprocess.run(["true"], check=False).returncode == 0


def test_cli_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from slurmtf.cli.sandbox import main

    assert main(["up", "--dir", str(tmp_path), "--nodes", "0"]) == 2
    assert "--nodes=0" in capsys.readouterr().err
    assert main(["status", "--dir", "/tmp/a b"]) == 2
    capsys.readouterr()
    assert main(["up", "--dir", str(tmp_path), "--cred_expire", "2m"]) == 2
    err = capsys.readouterr().err
    assert "--cred_expire='2m': must be whole seconds. HINT: " in err
    assert err.count("\n") == 1
    assert main(["bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slurmtf sandbox: argument command: invalid choice: 'bogus'")
    assert "HINT: usage: slurmtf sandbox" in err
    assert err.count("\n") == 1


def test_cli_on_a_directory_without_sandbox(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from slurmtf.cli.sandbox import main

    assert main(["env", "--dir", str(tmp_path)]) == 1
    assert "HINT: slurmtf sandbox up" in capsys.readouterr().err
    assert main(["status", "--dir", str(tmp_path)]) == 3
    assert main(["down", "--dir", str(tmp_path)]) == 0
    assert "was not running" in capsys.readouterr().out


def test_both_flag_spellings_reach_the_same_option() -> None:
    from slurmtf.cli.sandbox import _parser

    for spelling in ("--gpus_per_node", "--gpus-per-node"):
        assert _parser().parse_args(["up", spelling, "4"]).gpus_per_node == 4


def test_the_build_s_commands_come_first_and_its_daemons_run() -> None:
    cfg = SandboxConfig(
        dir=Path("/srv/sbx"), slurm_prefix="/opt/slurm-26.05.3", slurm_release="26.05.3"
    )
    assert cfg.daemon("slurmctld") == "/opt/slurm-26.05.3/sbin/slurmctld"
    assert cfg.client_dir == "/opt/slurm-26.05.3/bin"
    assert 'export PATH=/srv/sbx/bin:/opt/slurm-26.05.3/bin:"$PATH"' in c.render_env(cfg)
    debian = SandboxConfig(dir=Path("/srv/sbx"))
    assert debian.daemon("slurmd") == "slurmd"
    assert debian.client_dir == ""
    assert str(debian.release) == "22.05.8"


@pytest.mark.parametrize(
    ("release", "cgroup"),
    [("", None), ("22.05.8", None), ("23.11.10", None), ("24.05.0", "CgroupPlugin=disabled"),
     ("25.11.7", "CgroupPlugin=disabled"), ("26.05.3", "CgroupPlugin=disabled")],
)  # fmt: skip
def test_cgroup_conf_only_where_the_plugin_can_be_disabled(
    release: str, cgroup: str | None
) -> None:
    cfg = SandboxConfig(dir=Path("/srv/sbx"), slurm_release=release)
    text = c.render_cgroup_conf(cfg)
    if cgroup is None:
        assert text is None
    else:
        assert text is not None
        assert text.splitlines()[-1] == cgroup


def test_mpi_ports_are_a_slice_of_the_job_window_or_left_out() -> None:
    cfg = SandboxConfig(dir=Path("/srv/sbx"))
    low, high = c.resv_port_range(cfg.dir)
    assert ports.WINDOW_LOW <= low < high < ports.WINDOW_HIGH
    assert high - low + 1 == c.RESV_PORTS_SPAN
    assert f"MpiParams=ports={low}-{high}" in c.render_slurm_conf(cfg).splitlines()
    without = SandboxConfig(dir=Path("/srv/sbx"), resv_ports=False)
    assert without.resv_port_range is None
    assert "MpiParams" not in c.render_slurm_conf(without)


@pytest.mark.parametrize(
    ("prefix", "release", "problem"),
    [("opt/slurm", "", "--slurm='opt/slurm': must be an absolute path"),
     ("/opt/slurm", "twenty", "slurm_release='twenty': names no Slurm release")],
)  # fmt: skip
def test_bad_slurm_build_values_are_named(prefix: str, release: str, problem: str) -> None:
    with pytest.raises(InputError, match="HINT") as caught:
        SandboxConfig(dir=Path("/srv/sbx"), slurm_prefix=prefix, slurm_release=release)
    assert str(caught.value).startswith(problem)


def test_a_walled_sandbox_reserves_no_step_ports() -> None:
    """The firewall's prolog runs once per job, before any step: it cannot open the ports
    Slurm reserves per step, so --job_firewall leaves MpiParams=ports out."""
    walled = Sandbox(Path("/srv/sbx"), link="1gbit", job_firewall=True)
    assert walled.resv_ports is False
    assert Sandbox(Path("/srv/sbx")).resv_ports is True


@pytest.mark.parametrize(
    ("kwargs", "lines", "absent"),
    [
        ({}, ["SelectTypeParameters=CR_Core",
              "NodeName=DEFAULT CPUs=8 RealMemory=4000 State=UNKNOWN Gres=gpu:2"],
         ["DefCpuPerGPU", "ThreadsPerCore"]),
        ({"select_type_parameters": "CR_CPU", "def_cpu_per_gpu": 2, "gpus_per_node": 4},
         ["SelectTypeParameters=CR_CPU", "DefCpuPerGPU=2"], []),
        ({"threads_per_core": 2, "cpus_per_node": 16, "gpus_per_node": 4},
         ["NodeName=DEFAULT CPUs=16 Sockets=1 CoresPerSocket=8 ThreadsPerCore=2 "
          "RealMemory=4000 State=UNKNOWN Gres=gpu:4"], ["DefCpuPerGPU"]),
    ],
)  # fmt: skip
def test_how_nodes_hand_out_cpus_is_the_sites_choice(
    kwargs: dict[str, object], lines: list[str], absent: list[str]
) -> None:
    """A site's CPU settings, as SelectTypeParameters, DefCpuPerGPU and the nodes'
    threads say them: the job scripts must work on each (tests/e2e/test_gpu_forms.py)."""
    conf = c.render_slurm_conf(SandboxConfig(dir=Path("/srv/sbx"), **kwargs))  # type: ignore[arg-type]
    for line in lines:
        assert line in conf.splitlines()
    for word in absent:
        assert word not in conf


def test_the_cpu_settings_reach_the_sandbox_and_its_cli() -> None:
    from slurmtf.cli.sandbox import _parser

    args = _parser().parse_args(
        ["up", "--select-type-parameters", "CR_CPU", "--def_cpu_per_gpu", "2",
         "--threads_per_core", "2", "--cpus_per_node", "16"]
    )  # fmt: skip
    assert (args.select_type_parameters, args.def_cpu_per_gpu) == ("CR_CPU", 2)
    assert (args.threads_per_core, args.cpus_per_node) == (2, 16)
    with pytest.raises(InputError, match="--def_cpu_per_gpu=9"):
        Sandbox(Path("/srv/sbx"), gpus_per_node=2, def_cpu_per_gpu=9)
    cfg = SandboxConfig(dir=Path("/srv/sbx"), gpus_per_node=4, def_cpu_per_gpu=2,
                        threads_per_core=2)  # fmt: skip
    assert cfg.cpu_policy == "SelectTypeParameters=CR_Core, DefCpuPerGPU=2, 2 threads a core"


def test_a_namespace_holding_another_sandboxs_daemon_is_not_this_sandboxs() -> None:
    """``down`` kills what runs in the namespaces it recorded, but a namespace number freed
    by a dead daemon is given to the next namespace made, perhaps another sandbox's: seen
    when the test command ran the version matrix beside the suite, and one sandbox's
    ``down`` killed the other's slurmctld."""
    from slurmtf.sandbox.daemons import foreign_daemon

    mine, theirs = "/tmp/a/slurm0", "/tmp/b/slurm0"
    assert foreign_daemon(f"slurmctld -D -c -i -f {theirs}/slurm.conf", mine)
    assert foreign_daemon(f"munged -F --key-file={theirs}/munge/munge.key", mine)
    assert foreign_daemon(f"slurmd -D -f {mine}1/slurm.conf -N node1", mine)  # a longer name
    assert not foreign_daemon(f"slurmd -D -f {mine}/slurm.conf -N node1", mine)
    assert not foreign_daemon("python3 -m models.mnist", mine)  # a job's process


def test_up_refuses_a_dir_too_long_for_slurmstepds_sockets(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from slurmtf.cli.sandbox import main

    suffix = len("/spool/node10/node10_99999999.4294967291")  # the longest socket under it
    fits = Path("/tmp") / ("d" * (c.SOCKET_PATH_MAX - suffix - len("/tmp/")))
    c.check_socket_room(SandboxConfig(dir=fits, nodes=10))
    with pytest.raises(InputError, match="at most 67 characters"):
        c.check_socket_room(SandboxConfig(dir=Path(f"{fits}d"), nodes=10))
    long = tmp_path / ("d" * (c.SOCKET_PATH_MAX - len(str(tmp_path))))
    with pytest.raises(InputError, match="too long for slurmstepd's sockets"):
        Sandbox(long, nodes=2).up()
    assert not long.exists()  # refused before anything was made or started
    assert main(["up", "--dir", str(long), "--nodes", "2"]) == 2
    err = capsys.readouterr().err
    assert f"--dir='{long}': is too long for slurmstepd's sockets" in err
    assert "HINT: use a directory of at most" in err
