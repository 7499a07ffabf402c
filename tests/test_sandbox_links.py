"""Fast unit tests of the sandbox links' pure parts: rates, tc commands, address plan."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from slurmtf.cli.sandbox import main as sandbox_main
from slurmtf.errors import InputError
from slurmtf.sandbox import config as c
from slurmtf.sandbox import links
from slurmtf.sandbox.config import SandboxConfig

DATA = Path(__file__).parent / "data" / "sandbox"
LINKED = SandboxConfig(
    dir=Path("/srv/sbx"), nodes=2, gpus_per_node=1, ctld_port=20000, link="2.5gbit"
)


@pytest.mark.parametrize(
    ("text", "bps", "tc"),
    [
        ("1gbit", 1_000_000_000, "1gbit"),
        ("2.5gbit", 2_500_000_000, "2500mbit"),
        ("10gbit", 10_000_000_000, "10gbit"),
        ("100mbit", 100_000_000, "100mbit"),
        ("1500kbit", 1_500_000, "1500kbit"),
        (" 25GBit ", 25_000_000_000, "25gbit"),
        ("unshaped", 0, None),
    ],
)
def test_rates(text: str, bps: int, tc: str | None) -> None:
    assert links.parse_rate(text) == bps
    if tc is not None:
        assert links.format_rate(bps) == tc


@pytest.mark.parametrize(
    "text", ["", "1g", "1gbps", "10Gb/s", "fast", "-1gbit", "1e9bit", "500kbit", "1000gbit"]
)
def test_bad_rates_name_the_flag(text: str) -> None:
    with pytest.raises(InputError) as err:
        links.parse_rate(text)
    message = str(err.value)
    assert "--link" in message
    assert repr(text) in message or text in message
    assert "HINT:" in message


def test_tbf_command_and_burst() -> None:
    assert links.tc_shape("p-node1", "eth0", 1_000_000_000) == [
        "tc", "-n", "p-node1", "qdisc", "replace", "dev", "eth0", "root", "tbf",
        "rate", "1gbit", "burst", "500000", "latency", "20ms",
    ]  # fmt: skip
    assert links.tbf_burst(1_000_000_000) == 500_000
    assert links.tbf_burst(100_000_000) == links.TBF_MIN_BURST  # 4 ms would be 50 KB
    assert links.tbf_burst(10_000_000) == links.TBF_MIN_BURST  # 4 ms would be 5 KB
    assert links.tbf_burst(10_000_000_000) == 5_000_000


def test_plan_commands_stay_inside_own_namespaces() -> None:
    plan = links.LinkPlan(prefix="stfabc", nodes=2, rate_bps=1_000_000_000, subnet=7)
    assert plan.namespaces == ["stfabc-br", "stfabc-node1", "stfabc-node2"]
    assert (plan.node_addr(2), plan.ctld_addr) == ("10.250.7.2", "10.250.7.254")
    cmds = links.setup_commands(plan)
    for cmd in cmds:  # every command names one of our namespaces: the host is never touched
        if cmd[:3] == ["ip", "netns", "add"]:
            assert cmd[3] in plan.namespaces
        else:
            assert cmd[1] == "-n", cmd
            assert cmd[2] in plan.namespaces, cmd
    veths = [cmd for cmd in cmds if "veth" in cmd]
    assert veths[0][-2:] == ["netns", "stfabc-node1"]
    shaped = [cmd for cmd in cmds if cmd[0] == "tc"]
    assert [(cmd[2], cmd[6]) for cmd in shaped] == [
        ("stfabc-node1", "eth0"), ("stfabc-br", "node1"),
        ("stfabc-node2", "eth0"), ("stfabc-br", "node2"),
    ]  # fmt: skip
    assert links.shape_commands(plan, 0)[1] == [
        "tc", "-n", "stfabc-br", "qdisc", "del", "dev", "node1", "root",
    ]  # fmt: skip
    unshaped = links.LinkPlan(prefix="stfabc", nodes=2, rate_bps=0)
    assert not [cmd for cmd in links.setup_commands(unshaped) if cmd[0] == "tc"]
    assert links.teardown_commands(plan.namespaces)[0] == ["ip", "netns", "delete", "stfabc-br"]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"prefix": "Bad-Prefix"}, "prefix"), ({"nodes": 0}, "--nodes"), ({"subnet": 300}, "subnet")],
)
def test_bad_plans(kwargs: dict[str, object], name: str) -> None:
    values: dict[str, object] = {"prefix": "stf1", "nodes": 2, "rate_bps": 0, **kwargs}
    with pytest.raises(InputError, match=name):
        links.LinkPlan(**values)  # type: ignore[arg-type]


def test_linked_config_files() -> None:
    plan = LINKED.link_plan
    assert plan is not None
    assert plan.prefix.startswith("stf")
    assert plan == c.link_plan_for(Path("/srv/sbx"), 2, 2_500_000_000)
    assert c.link_plan_for(Path("/srv/other"), 2, 0).prefix != plan.prefix
    conf = c.render_slurm_conf(LINKED)
    assert f"SlurmctldHost=localhost({plan.ctld_addr})" in conf
    assert f"NodeName=node2 NodeHostname=localhost NodeAddr={plan.node_addr(2)} " in conf
    hosts = c.render_hosts("127.0.0.1 localhost\n", LINKED.node_names, plan)
    assert hosts.splitlines()[-2:] == [f"{plan.node_addr(1)} node1", f"{plan.node_addr(2)} node2"]
    # without --link nothing changes: loopback everywhere
    plain = SandboxConfig(dir=Path("/srv/sbx"), nodes=2, gpus_per_node=1, ctld_port=20000)
    assert plain.link_plan is None
    assert "NodeAddr=127.0.0.1 " in c.render_slurm_conf(plain)


def test_bad_link_in_config_and_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--link"):
        SandboxConfig(dir=Path("/srv/sbx"), link="1gbps")
    assert sandbox_main(["up", "--dir", str(tmp_path), "--link", "10G"]) == 2
    err = capsys.readouterr().err
    assert "--link" in err
    assert "HINT:" in err


def _run_shim(shim: Path, netns: str) -> str:
    """Run the client shim with `ip` and `nsenter` replaced by echoing fakes."""
    fake = shim.parent / "fake"
    fake.mkdir(exist_ok=True)
    (fake / "ip").write_text(f"#!/bin/sh\necho {netns}\n")
    (fake / "nsenter").write_text('#!/bin/sh\necho nsenter "$@"\n')
    for f in fake.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    cmd = [str(shim), "-N2", "hostname"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_client_shim_enters_bridge_only_from_outside(tmp_path: Path) -> None:
    shim = tmp_path / "srun"
    shim.write_text(links.render_client_shim("/bin/echo", "stfabc-br", "stfabc"))
    shim.chmod(0o755)
    assert _run_shim(shim, "") == "nsenter --net=/run/netns/stfabc-br -- /bin/echo -N2 hostname"
    assert _run_shim(shim, "stfabc-node2") == "-N2 hostname"  # inside a job: as is
    assert _run_shim(shim, "stfzzz-node2").startswith("nsenter")  # another sandbox's node


def test_effects_go_through_the_runner() -> None:
    calls: list[list[str]] = []

    def runner(cmd: Sequence[str]) -> subprocess.CompletedProcess[str]:
        calls.append(list(cmd))
        out = "stfabc-node1 (id: 3)\nother-br\nstfabc-br\n" if cmd[1] == "netns" else ""
        err = "Cannot remove namespace file: No such file" if cmd[2] == "delete" else ""
        return subprocess.CompletedProcess(list(cmd), 1 if err else 0, out, err)

    assert links.existing("stfabc", runner) == ["stfabc-node1", "stfabc-br"]
    assert links.destroy(["stfabc-br"], runner) == []  # already gone is fine
    plan = links.LinkPlan(prefix="stfabc", nodes=1, rate_bps=0)
    links.create(plan, runner)
    assert calls[2:] == links.setup_commands(plan)


def _tc_rates(cmds: list[list[str]]) -> list[tuple[str, str, str]]:
    """(namespace, device, rate or 'del') of each tc command."""
    return [(cmd[2], cmd[6], cmd[cmd.index("rate") + 1] if "rate" in cmd else "del")
            for cmd in cmds if cmd[0] == "tc"]  # fmt: skip


def test_one_node_gets_its_own_rate() -> None:
    assert links.parse_node_link("node3=100mbit", 4) == (3, 100_000_000)
    plan = links.LinkPlan(prefix="p", nodes=3, rate_bps=10**9, node_rates=((3, 10**8),))
    assert [plan.rate_of(i) for i in (1, 2, 3)] == [10**9, 10**9, 10**8]
    assert _tc_rates(links.setup_commands(plan))[-2:] == [
        ("p-node3", "eth0", "100mbit"), ("p-br", "node3", "100mbit"),
    ]  # fmt: skip
    assert _tc_rates(links.setup_commands(plan))[:2] == [
        ("p-node1", "eth0", "1gbit"), ("p-br", "node1", "1gbit"),
    ]  # fmt: skip
    # unshaped links, one node capped: only that node's two ends get a qdisc
    one = links.LinkPlan(prefix="p", nodes=3, rate_bps=0, node_rates=((2, 10**8),))
    assert _tc_rates(links.setup_commands(one)) == [
        ("p-node2", "eth0", "100mbit"), ("p-br", "node2", "100mbit"),
    ]  # fmt: skip
    # a running sandbox: change (or remove) one node's cap
    assert _tc_rates(links.node_shape_commands(plan, 2, 5 * 10**7)) == [
        ("p-node2", "eth0", "50mbit"), ("p-br", "node2", "50mbit"),
    ]  # fmt: skip
    assert _tc_rates(links.node_shape_commands(plan, 2, 0)) == [
        ("p-node2", "eth0", "del"), ("p-br", "node2", "del"),
    ]  # fmt: skip


@pytest.mark.parametrize("text", ["node5=1gbit", "node0=1gbit", "node3", "n3=1gbit", "node3=1G"])
def test_bad_node_link_names_the_flag(text: str) -> None:
    with pytest.raises(InputError) as err:
        links.parse_node_link(text, 4)
    assert "--node_link" in str(err.value)
    assert "HINT:" in str(err.value)


def test_node_link_in_config_and_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = SandboxConfig(dir=Path("/srv/sbx"), nodes=4, link="1gbit", node_link=("node3=100mbit",))
    assert cfg.link_plan is not None
    assert cfg.link_plan.node_rates == ((3, 100_000_000),)
    assert cfg.link_plan.prefix == LINKED.link_plan.prefix  # type: ignore[union-attr]
    with pytest.raises(InputError, match="--node_link"):
        SandboxConfig(dir=Path("/srv/sbx"), nodes=4, node_link=("node3=100mbit",))
    assert sandbox_main(["up", "--dir", str(tmp_path), "--node_link", "node3=100mbit"]) == 2
    assert "--node_link" in capsys.readouterr().err
    assert sandbox_main(["link", "--dir", str(tmp_path), "node3"]) == 2
    assert "node3" in capsys.readouterr().err
    assert sandbox_main(["status", "--dir", str(tmp_path), "node3", "1gbit"]) == 2
