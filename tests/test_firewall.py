"""The per-job firewall: ports, addresses and nftables text (pure), the prolog/epilog
edge with a fake ``nft``/``scontrol``/resolver, and the rendered text checked by the
real ``nft -c`` in a private network namespace."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from slurmtf.cli import main as slurmtf_main
from slurmtf.cluster import ports
from slurmtf.errors import InputError
from slurmtf.firewall import EPILOG, PROLOG, node, rules
from slurmtf.sandbox import config as c
from slurmtf.sandbox.config import SandboxConfig, render_slurm_conf
from tests.prereqs import require

ADDRS = {
    "node1": ["10.0.0.1"],
    "node2": ["10.0.0.2", "fd00::2"],
    "node3": ["10.0.0.3"],
    "node1-ib": ["10.1.0.1"],
    "node2-ib": ["10.1.0.2"],
}


class FakeNode:
    """Records ``nft``/``scontrol`` calls; resolves names from :data:`ADDRS`."""

    def __init__(self, scontrol: str = "", nft_code: int = 0) -> None:
        self.calls: list[tuple[list[str], str]] = []
        self.scontrol, self.nft_code = scontrol, nft_code

    def run(self, args: Sequence[str], stdin: str) -> tuple[int, str, str]:
        self.calls.append((list(args), stdin))
        if Path(args[0]).name == "scontrol":
            return (0, self.scontrol, "") if self.scontrol else (1, "", "no job")
        return self.nft_code, "", "Error: boom" if self.nft_code else ""

    def resolve(self, name: str) -> list[str]:
        if name not in ADDRS:
            raise node.FirewallError(f"node name {name!r} does not resolve")
        return ADDRS[name]

    def applied(self) -> str:
        (text,) = [stdin for args, stdin in self.calls if Path(args[0]).name != "scontrol"]
        return text


def _env(tmp_path: Path, settings: str = "", **extra: str) -> dict[str, str]:
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    log = tmp_path / "fw-%n.log"
    nft = "nft = /bin/true\n"
    (tmp_path / rules.SETTINGS_NAME).write_text(f"log = {log}\n{nft}{settings}")
    return {
        "SLURM_JOB_ID": "1234",
        "SLURM_NODELIST": "node[1-2]",
        "SLURM_JOB_CPUS_PER_NODE": "1(x2)",
        "SLURM_JOB_UID": "1000",
        "SLURMD_NODENAME": "node1",
        "SLURM_CONF": str(conf),
        **extra,
    }


def _log(tmp_path: Path, name: str = "node1") -> str:
    return (tmp_path / f"fw-{name}.log").read_text()


# ---- ports ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "max_tasks", "base", "expected"),
    [
        (1234, 2, None, ((15400, 15499),)),  # 1234 % 200 = 34; every attempt, in its slot
        (1234, 6, None, ((15400, 15499),)),  # 3 nodes x 2 tasks
        (1234, 1, None, ((15400, 15499),)),
        (1234, 4, 20000, ((20000, 20003),)),  # cluster-wide SLURMTF_PORT_BASE
        (1234, 100, 65500, ((65500, 65535),)),  # never past the last port
    ],
)
def test_job_ports(key: int, max_tasks: int, base: int | None, expected: tuple) -> None:
    assert rules.job_ports(key, max_tasks, base) == expected


@pytest.mark.parametrize(("key", "max_tasks"), [(1234, 150), (77, 512), (199, 2048)])
def test_job_ports_cover_every_step_size(key: int, max_tasks: int) -> None:
    """Bases move with the step size above 100 tasks: every step's ports are covered."""
    ranges = rules.job_ports(key, max_tasks)
    allowed = {p for first, last in ranges for p in range(first, last + 1)}
    for ntasks in range(1, max_tasks + 1):
        base = ports.derive_port_base(key, ntasks)
        assert set(range(base, base + ntasks)) <= allowed, ntasks
    assert len(ranges) >= 1
    assert ranges == rules.merge_ranges(ranges)


def test_merge_ranges() -> None:
    assert rules.merge_ranges([(5, 6), (1, 2), (3, 4), (9, 9), (8, 8)]) == ((1, 6), (8, 9))


# ---- rule text ----------------------------------------------------------------
def test_render_apply_one_range_both_families_and_a_user() -> None:
    text = rules.render_apply(
        rules.JobRules(
            job_id=7, ports=((12700, 12703),), peers4=("10.0.0.1",), peers6=("fd00::2",), uid=1000
        )
    )
    assert text.startswith(
        "table inet slurmtf_job_7\ndelete table inet slurmtf_job_7\ntable inet slurmtf_job_7 {\n"
    )
    assert "elements = { 12700-12703 }" in text
    assert "elements = { 10.0.0.1 }" in text
    assert "elements = { fd00::2 }" in text
    assert "\t\ttcp dport @ports jump guard\n" in text
    guard = text.split("chain guard {")[1].split("}")[0].split("\n")
    assert [line.strip() for line in guard if line.strip()] == [
        'iifname "lo" accept',
        "ip saddr @peers4 accept",
        "ip6 saddr @peers6 accept",
        "counter drop",
    ]
    assert "tcp dport @ports meta skuid != 0 meta skuid != 1000 counter drop" in text


def test_render_apply_several_ranges_no_ipv6_root_job() -> None:
    text = rules.render_apply(
        rules.JobRules(
            job_id=8, ports=((12000, 12000), (14000, 14150)), peers4=("10.0.0.1",), uid=0
        )
    )
    assert "elements = { 12000, 14000-14150 }" in text
    assert "peers6" not in text
    assert "meta skuid != 0 counter drop" in text
    assert "!= 0 meta" not in text


def test_render_apply_without_user_has_no_output_chain() -> None:
    text = rules.render_apply(rules.JobRules(job_id=9, ports=((13000, 13001),)))
    assert "chain output" not in text
    assert "peers4" not in text


def test_render_remove_is_idempotent_text() -> None:
    assert (
        rules.render_remove(42) == "table inet slurmtf_job_42\ndelete table inet slurmtf_job_42\n"
    )


def test_split_families_drops_loopback_and_repeats() -> None:
    assert rules.split_families(["10.0.0.1", "127.0.0.1", "::1", "fe80::1%eth0", "10.0.0.1"]) == (
        ("10.0.0.1",),
        ("fe80::1",),
    )


@pytest.mark.parametrize("bad", [((1000, 1001),), ((13000, 12000),), ()])
def test_job_rules_refuse_bad_ports(bad: tuple) -> None:
    with pytest.raises(InputError, match="ports"):
        rules.JobRules(job_id=1, ports=bad)


def test_parse_settings() -> None:
    text = "# comment\npython = /usr/bin/python3\nport_base=20000  # cluster-wide\n"
    assert rules.parse_settings(text) == {"python": "/usr/bin/python3", "port_base": "20000"}
    with pytest.raises(InputError, match=r"line 1.*HINT: use one of python"):
        rules.parse_settings("prot_base = 1\n", "fw.conf")


# ---- the prolog/epilog edge ----------------------------------------------------
def test_prolog_adds_the_jobs_table(tmp_path: Path) -> None:
    fake = FakeNode()
    assert node.main(["prolog"], _env(tmp_path), fake.run, fake.resolve) == 0
    text = fake.applied()
    assert fake.calls[0][0] == ["/bin/true", "-f", "-"]
    assert "table inet slurmtf_job_1234 {" in text
    assert "elements = { 15400-15499 }" in text
    assert "elements = { 10.0.0.1, 10.0.0.2 }" in text
    assert "elements = { fd00::2 }" in text
    assert "meta skuid != 1000" in text
    assert "table slurmtf_job_1234 added: tcp ports 15400-15499 open to 3 addresses" in _log(
        tmp_path
    )


def test_several_tasks_per_node_widen_the_ports(tmp_path: Path) -> None:
    fake = FakeNode()
    env = _env(tmp_path, SLURM_NODELIST="node[1-3]", SLURM_JOB_CPUS_PER_NODE="64,32(x2)")
    node.main(["prolog"], env, fake.run, fake.resolve)
    assert "elements = { 15400-17119 }" in fake.applied()  # 128 ranks, and their restarts
    assert "elements = { 10.0.0.1, 10.0.0.2, 10.0.0.3 }" in fake.applied()


def test_array_elements_each_get_their_own_table(tmp_path: Path) -> None:
    """An array element's prolog sees its own SLURM_JOB_ID (measured): own table, own ports."""
    texts = []
    for element in ("1400", "1401"):
        fake = FakeNode()
        env = _env(tmp_path, SLURM_JOB_ID=element, SLURM_ARRAY_JOB_ID="1400")
        node.main(["prolog"], env, fake.run, fake.resolve)
        texts.append(fake.applied())
    assert "table inet slurmtf_job_1400 {" in texts[0]
    assert "{ 12000-12099 }" in texts[0]
    assert "table inet slurmtf_job_1401 {" in texts[1]
    assert "{ 12100-12199 }" in texts[1]


def test_het_job_component_opens_to_every_component(tmp_path: Path) -> None:
    show = (
        "JobId=1234 HetJobId=1234 HetJobOffset=0 NodeList=node1 NumCPUs=2 NumTasks=2\n"
        "JobId=1235 HetJobId=1234 HetJobOffset=1 NodeList=node[2-3] NumCPUs=2 NumTasks=2\n"
    )
    fake = FakeNode(scontrol=show)
    env = _env(
        tmp_path, SLURM_JOB_ID="1235", SLURM_HET_JOB_ID="1234", SLURM_NODELIST="node[2-3]",
        SLURM_JOB_CPUS_PER_NODE="1(x2)", SLURMD_NODENAME="node2",
    )  # fmt: skip
    node.main(["prolog"], env, fake.run, fake.resolve)
    assert fake.calls[0][0] == ["scontrol", "show", "job", "-o", "1234"]
    text = fake.applied()
    assert "table inet slurmtf_job_1235 {" in text  # the component's own table
    assert "elements = { 15400-15499 }" in text  # the het job's key and all 4 CPUs
    assert "elements = { 10.0.0.1, 10.0.0.2, 10.0.0.3 }" in text


def test_the_clusters_own_scontrol_from_the_settings(tmp_path: Path) -> None:
    """A Slurm built into a prefix: the prolog's PATH has Debian's scontrol (or none)."""
    show = "JobId=7 HetJobId=7 HetJobOffset=0 NodeList=node1 NumCPUs=1 NumTasks=1\n"
    fake = FakeNode(scontrol=show)
    settings = "scontrol = /opt/slurm-26.05.3/bin/scontrol\n"
    env = _env(tmp_path, settings, SLURM_JOB_ID="7", SLURM_HET_JOB_ID="7",
               SLURM_NODELIST="node1", SLURMD_NODENAME="node1")  # fmt: skip
    node.main(["prolog"], env, fake.run, fake.resolve)
    assert fake.calls[0][0] == ["/opt/slurm-26.05.3/bin/scontrol", "show", "job", "-o", "7"]
    text = c.render_firewall_settings(
        SandboxConfig(dir=Path("/srv/sbx"), link="1gbit", job_firewall=True,
                      slurm_prefix="/opt/slurm-26.05.3"), "python3")  # fmt: skip
    assert rules.parse_settings(text)["scontrol"] == "/opt/slurm-26.05.3/bin/scontrol"


def test_address_template_adds_the_interconnect(tmp_path: Path) -> None:
    fake = FakeNode()
    node.main(["prolog"], _env(tmp_path, "address_template = {host}-ib\n"), fake.run, fake.resolve)
    assert "elements = { 10.0.0.1, 10.0.0.2, 10.1.0.1, 10.1.0.2 }" in fake.applied()


def test_cluster_wide_port_base(tmp_path: Path) -> None:
    fake = FakeNode()
    node.main(["prolog"], _env(tmp_path, "port_base = 20000\n"), fake.run, fake.resolve)
    assert "elements = { 20000-20001 }" in fake.applied()


def test_epilog_removes_the_table(tmp_path: Path) -> None:
    fake = FakeNode()
    assert node.main(["epilog"], _env(tmp_path), fake.run, fake.resolve) == 0
    assert fake.applied() == rules.render_remove(1234)
    assert "epilog job 1234 on node1: table slurmtf_job_1234 removed" in _log(tmp_path)


@pytest.mark.parametrize(
    ("settings", "extra", "fake", "said"),
    [
        ("nft = /nonexistent/nft\n", {}, FakeNode(), "nft not found (install nftables)"),
        ("", {}, FakeNode(nft_code=1), "/bin/true -f failed (exit 1): Error: boom"),
        ("", {"SLURM_NODELIST": "node9"}, FakeNode(), "'node9' does not resolve"),
        ("", {"SLURM_HET_JOB_ID": "1234"}, FakeNode(), "scontrol show job 1234 failed"),
        ("port_base = 80\n", {}, FakeNode(), "port_base='80'"),
        ("address_template = {hots}\n", {}, FakeNode(), "address_template"),
    ],
)
def test_prolog_never_fails_the_job(
    tmp_path: Path, settings: str, extra: dict[str, str], fake: FakeNode, said: str
) -> None:
    env = _env(tmp_path, settings, **extra)
    assert node.main(["prolog"], env, fake.run, fake.resolve) == 0
    (line,) = _log(tmp_path).splitlines()
    assert "prolog job 1234 on node1: NOT done, job runs without its firewall" in line
    assert said in line


def test_bad_settings_or_no_job_id_still_exit_0(tmp_path: Path) -> None:
    fake = FakeNode()
    assert node.main(["prolog"], _env(tmp_path, "colour = blue\n"), fake.run, fake.resolve) == 0
    assert node.main(["prolog"], {"SLURMD_NODENAME": "node1"}, fake.run, fake.resolve) == 0
    assert fake.calls == []


def test_parse_het_job() -> None:
    text = (
        "JobId=5 NodeList=n[1-2] NumCPUs=4\n"
        "JobId=6 NodeList=n2,n3 NumCPUs=3\n"
        "JobId=7 NodeList=(null)\n"
    )
    assert node.parse_het_job(text) == (["n1", "n2", "n3"], 7)


# ---- shipped scripts, CLI, sandbox ----------------------------------------------
def test_scripts_are_shipped_and_executable() -> None:
    for script in (PROLOG, EPILOG):
        assert script.stat().st_mode & stat.S_IXUSR, script
        subprocess.run(["sh", "-n", str(script)], check=True)


def test_print_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert slurmtf_main(["firewall", "--print-config"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"Prolog={PROLOG}" in out
    assert f"Epilog={EPILOG}" in out
    assert "PrologFlags=Alloc" in out
    assert any(line.startswith("python = /") for line in out)


def test_sandbox_renders_the_prolog_and_needs_links(tmp_path: Path) -> None:
    conf = render_slurm_conf(SandboxConfig(dir=tmp_path, link="1gbit", job_firewall=True))
    assert f"Prolog={PROLOG}\nEpilog={EPILOG}\nPrologFlags=Alloc\n" in conf
    plain = render_slurm_conf(SandboxConfig(dir=tmp_path, link="1gbit"))
    assert "\nProlog=" not in plain
    assert "\nEpilog=" not in plain
    with pytest.raises(InputError, match=r"--job_firewall.*HINT: add --link"):
        SandboxConfig(dir=tmp_path, job_firewall=True)


def test_the_script_runs_the_python_part(tmp_path: Path) -> None:
    """prolog.sh with slurmd's bare environment: no PATH, settings beside SLURM_CONF."""
    env = _env(tmp_path, f"python = {sys.executable}\n")
    env.pop("SLURM_NODELIST")
    done = subprocess.run([str(EPILOG)], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "epilog job 1234 on node1: table slurmtf_job_1234 removed" in _log(tmp_path)


def _nft() -> str:
    nft = shutil.which("nft") or next((p for p in node.NFT_PATHS if Path(p).exists()), None)
    require(nft is not None, "nft (apt-get install nftables)")
    require(os.geteuid() == 0 and shutil.which("unshare") is not None, "root and unshare")
    assert nft is not None
    return nft


def test_nft_accepts_the_rendered_text(tmp_path: Path) -> None:
    """The real nft checks every shape (``-c``: parse and validate, change nothing)."""
    nft = _nft()
    shapes = [
        rules.JobRules(1, ((12000, 12001),), ("10.0.0.1", "10.0.0.2"), ("fd00::2",), 1000),
        rules.JobRules(2, ((12000, 12000), (14000, 14150)), ("10.0.0.1",), (), 0),
        rules.JobRules(3, ((13000, 13003),)),
    ]
    path = tmp_path / "rules.nft"
    path.write_text("".join(map(rules.render_apply, shapes)) + rules.render_remove(3))
    done = subprocess.run(
        ["unshare", "--net", nft, "-c", "-f", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_apply_and_remove_are_idempotent(tmp_path: Path) -> None:
    """In a private network namespace: apply twice -> one table; remove twice -> none."""
    nft = _nft()
    job = rules.JobRules(5, ((12500, 12501),), ("10.0.0.1",), (), 1000)
    other = rules.JobRules(6, ((12600, 12601),), ("10.0.0.2",), (), 1000)
    (tmp_path / "a.nft").write_text(rules.render_apply(job))
    (tmp_path / "b.nft").write_text(rules.render_apply(other))
    (tmp_path / "rm.nft").write_text(rules.render_remove(5))
    script = (
        f"{nft} -f a.nft && {nft} -f b.nft && {nft} -f a.nft && {nft} list tables && "
        f"echo --- && {nft} -f rm.nft && {nft} -f rm.nft && {nft} list tables"
    )
    done = subprocess.run(
        ["unshare", "--net", "sh", "-c", script], cwd=tmp_path, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.split("---\n")
    assert sorted(before.splitlines()) == ["table inet slurmtf_job_5", "table inet slurmtf_job_6"]
    assert after.splitlines() == ["table inet slurmtf_job_6"]  # the other job's stays
