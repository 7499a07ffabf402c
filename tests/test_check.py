"""Fast unit tests of ``slurmtf check``: the pure verdict, the TCP mesh on loopback, and
the front end's commands and bad input (a fake runner; no Slurm, no TensorFlow)."""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from slurmtf.check import verdict
from slurmtf.check.mesh import Mesh, link_rates
from slurmtf.check.outliers import outliers
from slurmtf.check.probe import (
    bus_gbps,
    compute_window,
    device_label,
    host_turns,
    plan_devices,
    round_seconds,
)
from slurmtf.cli import check as cli
from slurmtf.cluster.ports import free_port_base
from slurmtf.errors import SlurmCommandError

G = 1e9


def _figures(n: int, compute: Sequence[float] | None = None) -> list[verdict.NodeFigures]:
    speeds = compute or [50.0] * n
    return [verdict.NodeFigures(rank=r, node=f"node{r + 1}", compute_gflops=speeds[r],
                                allreduce_gbps=0.8) for r in range(n)]  # fmt: skip


def _rates(n: int, slow: Mapping[int, float] | None = None) -> dict[int, dict[int, float]]:
    """Full matrix: a pair's rate is the slower end's link (a node's own rate both ways)."""
    link = {r: (slow or {}).get(r, 1 * G) for r in range(n)}
    return {s: {d: min(link[s], link[d]) for d in range(n) if d != s} for s in range(n)}


def test_equal_nodes_are_healthy() -> None:
    result = verdict.judge(_figures(4), _rates(4))
    assert result.healthy
    assert result.exit_status == 0
    assert verdict.closing_line(result) == "healthy: 4 nodes, no figure 3x below the median"
    assert [r["link_out_gbps"] for r in result.rows] == [1.0] * 4
    assert [r["role"] for r in result.rows] == ["chief", "worker", "worker", "worker"]


def test_one_slow_link_names_only_that_node() -> None:
    result = verdict.judge(_figures(4), _rates(4, {2: 0.1 * G}))
    assert result.exit_status == 1
    assert {(o.node, o.figure) for o in result.outliers} == {
        ("node3", "link out"), ("node3", "link in"),
    }  # fmt: skip
    line = verdict.closing_line(result)
    assert line == (
        "OUTLIER node3: link out 0.1 Gb/s, 10x below the median (1 Gb/s); "
        "link in 0.1 Gb/s, 10x below the median (1 Gb/s)"
    )
    assert "node2" not in line
    assert "node4" not in line
    rows = verdict.table(result).splitlines()
    assert rows[3].startswith("node3 *")
    assert "0.1!" in rows[3]
    assert "!" not in rows[1] + rows[2] + rows[4]


def test_three_nodes_still_name_the_bad_one() -> None:
    result = verdict.judge(_figures(3), _rates(3, {0: 0.05 * G}))
    assert {o.node for o in result.outliers} == {"node1"}


@pytest.mark.parametrize(("factor", "bad"), [(2.9, False), (3.1, True)])
def test_threshold_is_strict(factor: float, bad: bool) -> None:
    result = verdict.judge(_figures(4, [50, 50, 50 / factor, 50]), _rates(4))
    assert [o.figure for o in result.outliers] == (["compute"] if bad else [])


def test_gpu_count_and_json() -> None:
    figs = _figures(4)
    gpus = [("A100", "A100"), ("A100", "A100"), ("A100",), ("A100", "A100")]
    figs = [verdict.NodeFigures(f.rank, f.node, device_label(g), g, 50.0, 0.8)
            for f, g in zip(figs, gpus, strict=True)]  # fmt: skip
    result = verdict.judge(figs, _rates(4), extra={"seconds": 3.0})
    assert [o.line() for o in result.outliers] == ["node3: sees 1 GPUs, most nodes 2"]
    data = json.loads(json.dumps(result.to_json()))
    assert data["healthy"] is False
    assert data["nodes"][2]["device"] == "1x A100"
    assert data["seconds"] == 3.0
    assert data["outliers"][0]["figure"] == "gpus"


def test_suspects_are_measured_again() -> None:
    assert verdict.suspects([90.0, 20.0, 89.0, 91.0], 3.0) == {1}
    assert verdict.suspects([90.0, 40.0, 89.0, 91.0], 3.0) == set()


@pytest.mark.parametrize(
    ("values", "above", "found"),
    [
        ({"a": 1.0, "b": 10.0}, False, [("a", 10.0, 10.0)]),  # two are enough
        ({"a": 1.0, "b": 10.0}, True, [("b", 1.0, 10.0)]),
        ({"a": 90.0, "b": 20.0, "c": 89.0, "d": 91.0}, False, [("b", 90.0, 4.5)]),
        ({"a": 30.0, "b": 90.0, "c": 90.0}, False, []),  # exactly 3x: not more than
        ({"a": 0.0, "b": 5.0, "c": 5.0}, False, [("a", 5.0, float("inf"))]),
        ({"a": 5.0, "b": 0.0, "c": 0.0}, True, []),  # the others' median is 0: no ratio
        ({"a": 5.0}, False, []),
    ],
)
def test_an_outlier_is_judged_against_the_median_of_the_others(
    values: dict[str, float], above: bool, found: list[tuple[str, float, float]]
) -> None:
    got = outliers(values, 3.0, above=above)
    assert [(o.key, o.median, o.times) for o in got] == found


def test_two_nodes_cannot_blame_one() -> None:
    assert verdict.judge(_figures(2), _rates(2, {1: 0.1 * G})).healthy


def test_bad_threshold() -> None:
    with pytest.raises(verdict.InputError, match="--threshold"):
        verdict.judge(_figures(2), {}, threshold=1.0)


def test_gpu_plan() -> None:
    assert plan_devices([]) == (["/CPU:0"], "RING")
    assert plan_devices(["H100", "H100"]) == (["/GPU:0", "/GPU:1"], "NCCL")
    assert device_label([]) == "CPU"


def test_ranks_sharing_a_host_take_turns() -> None:
    assert [host_turns(["a", "b", "c"], r) for r in range(3)] == [(0, 1)] * 3
    hosts = ["h", "h", "g", "h"]
    assert [host_turns(hosts, r) for r in range(4)] == [(0, 3), (1, 3), (0, 3), (2, 3)]


def test_large_allocations_share_a_time_budget() -> None:
    # Up to 10 link rounds take 0.5 s each; 15 (16 nodes) share 5 s; never under 0.25 s.
    assert [round_seconds(k) for k in (1, 3, 10)] == [0.5, 0.5, 0.5]
    assert round_seconds(15) == pytest.approx(1 / 3)
    assert round_seconds(63) == 0.25
    # One rank per host measures for 0.5 s; 16 ranks sharing one host 0.125 s each.
    assert [compute_window(t) for t in (1, 4, 16, 64)] == [0.5, 0.5, 0.125, 0.1]


def test_bus_bandwidth_is_nccl_tests_busbw() -> None:
    # 4 MiB in 0.1 s over 4 replicas: 4 MiB x 8 / 0.1 s x 2 x 3/4.
    assert bus_gbps(4 << 20, 0.1, 4) == pytest.approx((4 << 20) * 8 / 0.1 * 1.5 / 1e9)
    assert bus_gbps(1 << 20, 1.0, 1) == pytest.approx((1 << 20) * 8 / 1e9)


def test_mesh_gathers_and_measures_on_loopback() -> None:
    n = 3
    base = free_port_base(n)
    workers = [f"127.0.0.1:{base + r}" for r in range(n)]
    results: dict[int, object] = {}

    def rank(r: int) -> None:
        mesh = Mesh(r, workers, timeout=20)
        try:
            results[r] = (mesh.allgather(f"hi{r}"), link_rates(mesh, 5, 0.1))
        finally:
            mesh.close()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    gathered, rates = results[1]  # type: ignore[misc]
    assert gathered == ["hi0", "hi1", "hi2"]
    assert sorted(rates) == [0, 1, 2]
    assert all(sorted(rates[s]) == [d for d in range(n) if d != s] for s in range(n))
    assert all(v > 1e6 for row in rates.values() for v in row.values())
    assert results[0] == results[1] == results[2]


def _args(**kw: object) -> argparse.Namespace:
    values = {"threshold": 3.0, "link_seconds": 0.5, "link_rounds": 15, "allreduce_mb": 4.0,
              "nodes": 4, "partition": None, **kw}  # fmt: skip
    return argparse.Namespace(**values)


def test_commands() -> None:
    step = cli.step_command(4, "py", _args())
    assert step[:4] == ["srun", "--nodes=4", "--ntasks=4", "--ntasks-per-node=1"]
    assert step[-4:] == ["--threshold=3.0", "--link_seconds=0.5", "--link_rounds=15",
                         "--allreduce_mb=4.0"]  # fmt: skip
    assert "slurmtf.check.probe" in step
    # Without --link_seconds the probe chooses it from the number of rounds.
    assert not any(a.startswith("--link_seconds") for a in cli.probe_args(_args(link_seconds=None)))
    job = cli.job_command(_args(partition="gpu"), "py", Path("/o"))
    assert "--nodes=4" in job
    assert "--partition=gpu" in job
    assert job[-1].startswith("--wrap=py -m slurmtf.cli check --threshold=3.0")
    assert job[-1].endswith("--json=/o/check-$SLURM_JOB_ID.json")


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["--threshold=1"], "--threshold"),
        (["--nodes=0"], "--nodes"),
        (["--link_seconds=0"], "--link_seconds"),
        ([], "SLURM_JOB_ID"),
    ],
)
def test_bad_input_exits_2(
    argv: list[str], name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
                "SLURM_STEP_NODELIST"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert name in err
    assert "HINT:" in err


def test_in_allocation_reads_rank0_verdict(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-4]")
    event = verdict.judge(_figures(4), _rates(4, {3: 0.1 * G})).to_json()
    calls: list[list[str]] = []

    def runner(args: Sequence[str], **_: object) -> str:
        calls.append(list(args))
        return "noise\n" + json.dumps({"event": "check", **event}) + "\n"

    assert cli.main(["--json", str(tmp_path / "v.json")], runner=runner) == 1
    assert calls[0] == ["scontrol", "show", "config"]  # MpiParams=ports: none here
    assert calls[1][:2] == ["srun", "--nodes=4"]
    assert not any(a.startswith("--resv-ports") for a in calls[1])
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("OUTLIER node4: link out 0.1 Gb/s")
    assert json.loads((tmp_path / "v.json").read_text())["healthy"] is False

    def failing(args: Sequence[str], **_: object) -> str:
        raise SlurmCommandError("srun", 1, "node2: connection refused")

    assert cli.main([], runner=failing) == 1
    assert "connection refused" in capsys.readouterr().err


def test_submit_check_first_renders_the_check_before_training() -> None:
    import io

    from slurmtf.cli import submit as submit_cli

    out = io.StringIO()
    assert (
        submit_cli.main(["--dry_run", "--model=mnist", "--nodes=4", "--check_first"], out=out) == 0
    )
    script = out.getvalue()
    (handover,) = [line for line in script.splitlines() if line.startswith("srun() {")]
    assert "slurmtf job submitit" in handover, handover
    assert " --check_first " in handover, handover
    assert script.index(handover) < script.index("\nsrun ")
    out = io.StringIO()
    assert submit_cli.main(["--dry_run", "--model=mnist", "--nodes=4"], out=out) == 0
    assert "--check_first" not in out.getvalue()


def test_bench_check_table() -> None:
    from benchmarks import bench_check

    row = {"nodes": 4, "exit": 0, "wall_s": 38.0, "step_s": 30.0, "allreduce_gbps": 0.4,
           "phases_s": {"links": 2.0, "import": 20.0, "strategy": 21.0, "allreduce": 27.0,
                        "compute": 29.0},
           "link_out_gbps_median": 0.9}  # fmt: skip
    table = bench_check.markdown({"results": [row]})
    assert table.splitlines()[0].startswith("| nodes | exit | wall s |")
    assert "| 4 | 0 | 38 | 30 | 2 | 20 | 21 | 27 | 29 | 0.9 | 0.4 |" in table
