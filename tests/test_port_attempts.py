"""Ports across attempts, Slurm's reserved ports, and a held port as a node's state.

No Slurm, no TensorFlow: the port rule per attempt (pure), ``SLURM_STEP_RESV_PORTS`` as
Slurm writes it (src/common/port_mgr.c: a sorted hostlist of numbers without brackets,
the same on every node of the step), the ``port_in_use`` event and what recovery makes
of it.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmtf.cli import submit as submit_cli
from slurmtf.cluster import ports
from slurmtf.errors import InputError
from slurmtf.firewall import rules
from slurmtf.local.step import LocalStep
from slurmtf.resolver import explain, resolve
from slurmtf.runtime.rank import held_port
from slurmtf.runtime.recovery.decision import Budget, decide
from slurmtf.runtime.recovery.endings import Attempt, TaskEnding
from slurmtf.runtime.recovery.evidence import LogFiles, read_attempt
from tests.conftest import FakeSlurmEnv

# ------------------------------------------------------------------ the rule per attempt


@pytest.mark.parametrize(
    ("ntasks", "attempt", "expected"),
    [
        (2, 0, 15400),
        (2, 1, 15402),  # moves by the job's size inside its slot
        (2, 49, 15498),
        (2, 50, 15500),  # 50 attempts later: the next slot (its neighbour's)
        (8, 3, 15424),
        (32, 2, 15464),
        (32, 3, 15520),  # 100 // 32 = 3 in the slot, then the window's next block
        (60, 1, 15480),  # over 50 ranks: the next block of its size in the window
        (60, 2, 15540),
        (1, 5, 15405),
    ],
)
def test_the_base_moves_by_attempt(ntasks: int, attempt: int, expected: int) -> None:
    base = ports.derive_port_base(1234, ntasks)  # 1234 % 200 = 34: 15400
    assert ports.attempt_base(base, ntasks, attempt) == expected


@pytest.mark.parametrize("ntasks", [1, 2, 3, 7, 16, 33, 50, 51, 100, 101, 640, 5000])
@pytest.mark.parametrize("key", [0, 1234, 199, 975096])
def test_consecutive_attempts_never_share_a_port(ntasks: int, key: int) -> None:
    base = ports.derive_port_base(key, ntasks)
    sets = ports.SLOT_SIZE // ntasks
    window = ports.WINDOW_HIGH - ports.WINDOW_LOW
    attempts = max(sets, 12) if ntasks <= 1000 else window // ntasks - 1
    seen: set[int] = set()
    for attempt in range(attempts):
        first = ports.attempt_base(base, ntasks, attempt)
        used = set(range(first, first + ntasks))
        assert not used & seen, (ntasks, attempt)
        assert first >= ports.WINDOW_LOW
        assert first + ntasks <= ports.WINDOW_HIGH
        if attempt < sets:  # a small job's first attempts stay in its slot
            assert first + ntasks <= base + ports.SLOT_SIZE
        seen |= used


def test_the_firewall_covers_every_attempt() -> None:
    for ntasks in (2, 60, 300):
        allowed = {p for a, b in rules.job_ports(1234, ntasks) for p in range(a, b + 1)}
        base = ports.derive_port_base(1234, ntasks)
        for attempt in range(ports.COVERED_ATTEMPTS):
            first = ports.attempt_base(base, ntasks, attempt)
            assert set(range(first, first + ntasks)) <= allowed, (ntasks, attempt)


def test_a_restart_in_place_gives_every_rank_new_ports(fake_slurm_env: FakeSlurmEnv) -> None:
    env = fake_slurm_env.step_vars("node[1-2]", "2(x2)", procid=3, job_id=1234)
    first = resolve(env)
    again = resolve(env | {"SLURM_RESTART_COUNT": "1"})
    assert first.workers == ("node1:15400", "node1:15401", "node2:15402", "node2:15403")
    assert again.workers == ("node1:15404", "node1:15405", "node2:15406", "node2:15407")
    assert (again.port_source, again.port_moves) == ("job", True)
    assert again.port_rule == "15404 + rank (job 1234: base 15400; attempt 1: +4)"
    text = explain(again)
    assert "ports 15404..15407" in text
    assert text.splitlines()[-2] == f"ports: {again.port_rule}"


@pytest.mark.parametrize("name", ["SLURMTF_PORT_BASE", "--port_base"])
def test_a_base_the_user_fixed_is_not_moved(fake_slurm_env: FakeSlurmEnv, name: str) -> None:
    env = fake_slurm_env.step_vars("node[1-2]", "1(x2)", procid=1, SLURM_RESTART_COUNT=2)
    env |= {"SLURM_STEP_RESV_PORTS": "20000-20001"}  # fixed wins over Slurm's too
    if name == "SLURMTF_PORT_BASE":
        layout = resolve(env | {name: "30000"})
    else:
        layout = resolve(env, port_base=30000)
    assert layout.workers == ("node1:30000", "node2:30001")
    assert (layout.port_source, layout.port_moves) == ("fixed", False)
    assert "fixed, the same on every attempt" in layout.port_rule


# ------------------------------------------------------------------ Slurm's reserved ports


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12000-12003", (12000, 12001, 12002, 12003)),
        ("12000", (12000,)),
        ("12000,12005-12006", (12000, 12005, 12006)),
        ("12998-12999,12000-12001", (12998, 12999, 12000, 12001)),  # as written
        ("[20004-20007]", (20004, 20005, 20006, 20007)),
        (" 999,1000 ", (999, 1000)),
    ],
)
def test_reserved_ports_as_slurm_writes_them(text: str, expected: tuple[int, ...]) -> None:
    assert ports.parse_reserved_ports(text) == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "not a port or LOW-HIGH"),
        ("abc", "'abc', not a port"),
        ("12000-", "'12000-', not a port"),
        ("12003-12000", "reversed range '12003-12000'"),
        ("70000", "'70000', not a port"),
        ("0", "'0', not a port"),
        ("12000,,12001", "'', not a port"),
        ("12000-12002,12001", "lists a port twice"),
        ("1-65535,1-65535", "lists more than 65535 ports"),
    ],
)
def test_malformed_reserved_ports_name_the_variable(text: str, problem: str) -> None:
    with pytest.raises(InputError) as info:
        ports.parse_reserved_ports(text)
    message = str(info.value)
    assert message.startswith(f"SLURM_STEP_RESV_PORTS={text!r}: "), message
    assert problem in message, message
    assert "HINT: " in message, message


def _resv_step(fake: FakeSlurmEnv, procid: int, resv: str, **extra: Any) -> dict[str, str]:
    env = fake.step_vars("node[1-2]", "2(x2)", procid=procid, job_id=77, **extra)
    return env | {"SLURM_STEP_RESV_PORTS": resv}


def test_one_reserved_port_per_rank(fake_slurm_env: FakeSlurmEnv) -> None:
    """srun --resv-ports=NTASKS (the job scripts): distinct on one network stack too."""
    layouts = [resolve(_resv_step(fake_slurm_env, r, "20004-20007")) for r in range(4)]
    assert {lay.workers for lay in layouts} == {
        ("node1:20004", "node1:20005", "node2:20006", "node2:20007")
    }
    assert [lay.port for lay in layouts] == [20004, 20005, 20006, 20007]
    assert layouts[0].port_source == "reserved"
    assert "SLURM_STEP_RESV_PORTS=20004-20007" in layouts[0].port_rule


def test_slurms_own_count_gives_each_node_distinct_ports(fake_slurm_env: FakeSlurmEnv) -> None:
    """A plain srun under MpiParams=ports: the most tasks of a node + 1, per local id."""
    layout = resolve(_resv_step(fake_slurm_env, 2, "20001-20003"))
    assert layout.workers == ("node1:20001", "node1:20002", "node2:20001", "node2:20002")
    assert layout.port == 20001
    assert "(per node)" in layout.port_rule


def test_too_few_reserved_ports(fake_slurm_env: FakeSlurmEnv) -> None:
    with pytest.raises(InputError, match=r"^SLURM_STEP_RESV_PORTS='20001': lists 1 port\(s\), "
                       r"fewer than the 2 tasks of a node\. HINT: .*--resv-ports"):  # fmt: skip
        resolve(_resv_step(fake_slurm_env, 0, "20001"))


def test_reserved_ports_ignored_when_asked_or_in_a_het_step(fake_slurm_env: FakeSlurmEnv) -> None:
    off = resolve(_resv_step(fake_slurm_env, 0, "20004-20007", SLURMTF_RESV_PORTS="0"))
    assert (off.port_source, off.port) == ("job", ports.derive_port_base(77, 4))
    het = fake_slurm_env.step_vars(
        "node[1-2]", "1(x2)", procid=0, SLURM_HET_SIZE=2,
        SLURM_JOB_NODELIST_HET_GROUP_0="node1", SLURM_JOB_NODELIST_HET_GROUP_1="node2",
        SLURM_JOB_ID_HET_GROUP_0=500, SLURM_JOB_ID_HET_GROUP_1=501, SLURM_HET_JOB_ID=500,
    )  # fmt: skip
    layout = resolve(het | {"SLURM_STEP_RESV_PORTS": "20000-20001"})
    assert layout.port_source == "job"  # a component's reservation is not the step's


@pytest.mark.parametrize(
    ("value", "mode"),
    [(None, None), ("auto", None), ("1", True), ("ON", True), ("0", False), ("off", False)],
)
def test_the_resv_ports_setting(value: str | None, mode: bool | None) -> None:
    assert ports.parse_resv_mode(value) is mode


def test_a_bad_resv_ports_setting() -> None:
    with pytest.raises(InputError, match=r"^SLURMTF_RESV_PORTS='maybe': .* HINT: "):
        ports.parse_resv_mode("maybe")


# ------------------------------------------------------------------ a held port


def _holder(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A process listening on a free port (as a leftover rank would)."""
    ready = tmp_path / "port"
    code = (
        "import socket, sys, time\n"
        "s = socket.socket(); s.bind(('', 0)); s.listen()\n"
        "open(sys.argv[1], 'w').write(str(s.getsockname()[1])); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(ready)])
    deadline = time.monotonic() + 10
    while not ready.exists() or not ready.read_text():
        assert time.monotonic() < deadline, "the holder never listened"
        time.sleep(0.02)
    return proc, int(ready.read_text())


def test_a_held_port_names_port_node_and_holder(
    fake_slurm_env: FakeSlurmEnv, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proc, port = _holder(tmp_path)
    try:
        env = fake_slurm_env.step_vars("node[1-2]", "1(x2)", procid=1, SLURMD_NODENAME="node2")
        layout = resolve(env, port_base=port - 1)
        with pytest.raises(held_port.PortHeldError) as info:
            held_port.check_port(layout)
    finally:
        proc.kill()
        proc.wait()
    (event,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert event["event"] == "port_in_use"
    assert (event["rank"], event["port"], event["node"]) == (1, port, "node2")
    assert event["holder_pid"] == proc.pid
    assert event["moves"] is False
    message = str(info.value)
    assert f"rank 1's port {port} on node2 is held by pid {proc.pid}" in message
    assert "\n" not in message  # the holder's -c code has newlines: one line all the same
    assert "slurmtf does not move them. HINT: " in message


def test_a_free_port_and_a_single_worker_pass(fake_slurm_env: FakeSlurmEnv) -> None:
    held_port.check_port(resolve({}))  # a single worker opens no port
    env = fake_slurm_env.step_vars("node[1-2]", "1(x2)", procid=0)
    held_port.check_port(resolve(env, port_base=ports.free_port_base(2)))


def test_no_holder_without_a_socket() -> None:
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    assert held_port.holder_of(port) is None


HELD = {"event": "port_in_use", "rank": 1, "port": 15401, "node": "node2",
        "holder": "pid 42 (python3 -m models.mnist; job 7 rank 1 on node2)", "moves": True,
        "rule": "15400 + rank (job 1234: base 15400; attempt 0: +0)"}  # fmt: skip


@pytest.mark.parametrize(
    ("event", "action", "words"),
    [
        (HELD, "restart", "rank 1's port 15401 on node2 was held by pid 42 (python3 -m "
         "models.mnist; job 7 rank 1 on node2) (the node's state, not the rank's error"),
        ({**HELD, "holder": None}, "restart", "was held by another process"),
        ({**HELD, "moves": False, "rule": "30000 + rank (SLURMTF_PORT_BASE=30000: fixed, "
          "the same on every attempt)"}, "stop",
         "slurmtf does not move them. HINT: pick another free base"),
    ],
)  # fmt: skip
def test_recovery_restarts_on_other_ports(event: dict[str, Any], action: str, words: str) -> None:
    ended = Attempt(1, (TaskEnding.parse("task 1: Exited with exit code 1"),), {1: [event]})  # type: ignore[arg-type]
    decision = decide(ended, Budget(0, 3))
    assert decision.action == action
    assert words in decision.why, decision.why
    if action == "restart":
        assert decision.restart == 1  # counted against MAX_RESTARTS
        line = decision.line("77")
        assert line.startswith(
            "restart 1 in place (1 of 3 without progress, MAX_RESTARTS) after rank 1's port 15401"
        )
    else:
        assert decision.why.startswith("failed: rank 1's port 15401 on node2")


def test_a_held_port_spends_the_budget_too() -> None:
    ended = Attempt(1, (), {1: [HELD]})
    decision = decide(ended, Budget(3, 3))
    assert decision.action == "stop"
    assert "MAX_RESTARTS=3" in decision.why


def test_the_edge_reads_the_event_from_the_ranks_log(tmp_path: Path) -> None:
    (tmp_path / "rank0.out").write_text("")
    (tmp_path / "rank1.out").write_text(json.dumps(HELD) + "\n")
    (tmp_path / "rank1.err").write_text(
        "slurmtf: rank 1's port 15401 on node2 is held by pid 42. HINT: ...\n"
    )
    srun_err = tmp_path / "srun.err"
    srun_err.write_text("srun: error: node2: task 1: Exited with exit code 1\n")
    found = read_attempt(1, LogFiles(tmp_path, srun_err=srun_err))
    assert decide(found, Budget(0, 3)).action == "restart"


def test_a_local_restart_moves_the_ports_too() -> None:
    """--cluster=local: each attempt's ranks get the attempt as SLURM_RESTART_COUNT."""
    nodes = ("127.0.0.1", "127.0.0.2")
    first = resolve(LocalStep(nodes, 2, 4242).rank_env(0))
    again = resolve(LocalStep(nodes, 2, 4242, restarts=1).rank_env(0))
    assert first.port_source == again.port_source == "job"
    old = {w.rsplit(":", 1)[1] for w in first.workers}
    assert not old & {w.rsplit(":", 1)[1] for w in again.workers}


def test_cluster_local_restarts_on_other_ports_when_one_is_held(tmp_path: Path) -> None:
    """--cluster=local (job id: this process's id): rank 1's port held before the run."""
    port = ports.derive_port_base(os.getpid(), 2) + 1
    code = (
        "import socket, sys, time\ns = socket.socket()\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('', int(sys.argv[1]))); s.listen(); print('ok', flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(port)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"ok", "could not hold the port"
        out = io.StringIO()
        show = f"{sys.executable} -c \"import os; print('CFG', os.environ['TF_CONFIG'])\""
        argv = ["--cluster=local", "--nodes=2", f"--log_dir={tmp_path}", f"--command={show}",
                "--max_restarts=2"]  # fmt: skip
        assert submit_cli.main(argv, out=out) == 0, out.getvalue()
    finally:
        holder.kill()
        holder.communicate()
    said = out.getvalue()
    assert "restart 1 in place (1 of 2 without progress, MAX_RESTARTS)" in said, said
    assert f"rank 1's port {port} on 127.0.0.2 was held by pid {holder.pid} (" in said, said
    configs = [line for p in tmp_path.glob("*_log.out") for line in p.read_text().splitlines()
               if line.startswith("CFG ")]  # fmt: skip
    rank1 = [line for line in configs if '"index": 1' in line]
    assert len(rank1) == 1, configs  # rank 1 ran its command once: in the second attempt
    assert f":{port}" not in rank1[0], configs


def _ranges(found: list[int]) -> str:
    """Ports as Slurm writes them: sorted runs as LOW-HIGH, joined by commas."""
    runs: list[list[int]] = []
    for port in found:
        if runs and port == runs[-1][1] + 1:
            runs[-1][1] = port
        else:
            runs.append([port, port])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


@settings(max_examples=200, deadline=None)
@given(
    per_node=st.lists(st.integers(1, 4), min_size=1, max_size=6),
    extra=st.integers(0, 3),
    start=st.integers(1024, 60000),
    gaps=st.lists(st.integers(1, 3), min_size=30, max_size=30),
)
def test_reserved_ports_give_every_rank_its_own(
    per_node: list[int], extra: int, start: int, gaps: list[int]
) -> None:
    """One port per rank (or more): every rank agrees on the list, ranks never share a
    port, and each port is one Slurm reserved."""
    ntasks = sum(per_node)
    found, port = [], start
    for gap in gaps[: ntasks + extra]:
        found.append(port)
        port += gap
    text = _ranges(found)
    nodes = ",".join(f"n{i}" for i in range(len(per_node)))
    counts = ",".join(map(str, per_node))
    layouts = [
        resolve({"SLURM_STEP_NODELIST": nodes, "SLURM_STEP_TASKS_PER_NODE": counts,
                 "SLURM_PROCID": str(r), "SLURM_JOB_ID": "5", "SLURM_STEP_RESV_PORTS": text})
        for r in range(ntasks)
    ]  # fmt: skip
    assert len({lay.workers for lay in layouts}) == 1
    used = [lay.port for lay in layouts]
    assert len(set(used)) == ntasks
    assert set(used) <= set(found)


def test_a_port_taken_while_tensorflow_loaded(
    fake_slurm_env: FakeSlurmEnv, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After TensorFlow failed to start its server: held by another process -> the same
    event and error; free, or held by this very process (TensorFlow's own server) -> no."""
    env = fake_slurm_env.step_vars("node[1-2]", "1(x2)", procid=0, SLURMD_NODENAME="node1")
    held_port.recheck_port(resolve(env, port_base=ports.free_port_base(2)))  # free
    with socket.socket() as mine:
        mine.bind(("", 0))
        mine.listen()
        held_port.recheck_port(resolve(env, port_base=mine.getsockname()[1]))  # ours
    proc, port = _holder(tmp_path)
    try:
        with pytest.raises(held_port.PortHeldError, match="taken while TensorFlow loaded"):
            held_port.recheck_port(resolve(env, port_base=port))
    finally:
        proc.kill()
        proc.wait()
    (event,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (event["port"], event["holder_pid"]) == (port, proc.pid)
