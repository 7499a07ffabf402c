"""Node-count ranges: parsing, the batch that must split, status wording, rendering, and
the step's task count that the supervisor sets from the allocation. No Slurm, no TF."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from slurmtf.cli import submit as submit_cli
from slurmtf.errors import InputError
from slurmtf.monitor.status import shape_lines
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.runtime.job.srun_flags import step_tasks as supervisor_tasks
from slurmtf.slurm.runner import Runner
from slurmtf.spec import jobspec, noderange
from slurmtf.spec.jobspec import JobSpec
from slurmtf.training.flags import check_batch_size

CPUS = "SLURM_JOB_CPUS_PER_NODE"


@pytest.mark.parametrize(
    ("text", "low", "high"),
    [("4", 4, 4), ("2-4", 2, 4), (" 2-4 ", 2, 4), ("3-3", 3, 3), ("1", 1, 1), ("10-16", 10, 16)],
)
def test_parse_nodes(text: str, low: int, high: int) -> None:
    got = noderange.parse_nodes(text)
    assert (got.low, got.high) == (low, high)
    assert got.is_range == (high > low)
    assert str(got) == (f"{low}-{high}" if high > low else str(low))


@pytest.mark.parametrize("text", ["4-2", "0-2", "0", "x", "", "2-", "-2", "2-4-6", "2:4", "1.5"])
def test_bad_node_counts_name_the_flag_and_the_fix(text: str) -> None:
    with pytest.raises(InputError) as caught:
        noderange.parse_nodes(text)
    message = str(caught.value)
    assert message.startswith(f"--nodes={text!r}: ")
    assert "HINT: " in message
    assert "\n" not in message


@pytest.mark.parametrize("text", ["4-2", "0-2", "x"])
def test_submit_refuses_a_bad_range_in_one_line(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert submit_cli.main(["--dry_run", "--model=mnist", f"--nodes={text}"], io.StringIO()) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"--nodes={text!r}" in err, err
    assert "HINT: " in err, err


def test_a_range_batch_error_lists_the_worker_counts_that_split_it() -> None:
    assert check_batch_size(12, 3) == 4
    assert check_batch_size(12, 2) == 6
    with pytest.raises(InputError) as caught:
        check_batch_size(10, 3)
    message = str(caught.value)
    assert message.startswith("--batch_size=10: ")
    assert "use --batch_size=9 (nearest multiple of 3)" in message
    assert message.endswith("a worker count that splits it: 1, 2, 5, 10")
    with pytest.raises(InputError) as caught:  # two replicas per worker: 6 = 2 x 3 workers
        check_batch_size(6, 4, local_replicas=2)
    assert str(caught.value).endswith("splits it: 1, 3")


def test_split_counts_are_bounded() -> None:
    assert noderange.split_counts(1024) == "1, 2, 4, 8, 16, 32, 64"
    assert noderange.split_counts(720) == "1, 2, 3, 4, 5, 6, 8, 9, ..."
    assert noderange.split_counts(7, local_replicas=2) == "none"


def cluster(workers: int, restart: int) -> dict[str, object]:
    return {"event": "cluster", "num_workers": workers, "restart_count": restart}


@pytest.mark.parametrize(
    ("starts", "line"),
    [
        ([], None),
        ([cluster(3, 0)], None),
        ([cluster(3, 0), cluster(3, 1)], None),
        ([cluster(3, 0), cluster(2, 1)], "2 workers (was 3 before restart 1)"),
        ([cluster(3, 0), cluster(2, 1), cluster(2, 2)], "2 workers (was 3 before restart 1)"),
        ([cluster(2, 0), cluster(3, 1), cluster(1, 2)], "1 worker (was 3 before restart 2)"),
        (
            [cluster(2, 0), {"event": "cluster"}, cluster(4, 2)],
            "4 workers (was 2 before restart 2)",
        ),
    ],
)
def test_workers_line(starts: list[dict[str, object]], line: str | None) -> None:
    assert noderange.workers_line(starts) == line


SINFO = (
    "node1|alloc|none\nnode2|idle|none\nnode3|drain|node-range-test\nnode4|down*|Not responding\n"
)


def fake_runner(sinfo: str) -> Runner:
    def run(args: object, **_: object) -> str:
        assert list(args)[:1] == ["sinfo"]  # type: ignore[call-overload]
        return sinfo

    return run  # type: ignore[return-value]


def test_parse_nodes_states_keeps_the_unavailable() -> None:
    assert noderange.parse_nodes_states(SINFO) == {
        "node3": "drain (node-range-test)",
        "node4": "down (Not responding)",
    }


# Slurm 22.05's Reason for a 3-node job with node3 drained, as scontrol -o prints it
DRAINED = (
    "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions"
)


def test_status_says_why_a_fixed_count_job_waits() -> None:
    fields = {"JobState": "PENDING", "Reason": DRAINED, "NumNodes": "3-3"}
    line, why = shape_lines(fields, [], fake_runner(SINFO))
    assert line == (
        "  pending: waits for nodes that are down, drained or reserved (Nodes required for job "
        "are DOWN, DRAINED or reserved for jobs in higher priority partitions); it asks 3 "
        "node(s); unavailable: node3 drain (node-range-test), node4 down (Not responding) "
        "(a --nodes=MIN-MAX range would start on the nodes left)"
    )
    assert why.endswith(
        "HINT: an admin runs `scontrol update nodename=node3,node4 state=resume` once they are fine"
    )
    fields = {"JobState": "PENDING", "Reason": "Resources", "NumNodes": "2-3"}
    (line,) = shape_lines(fields, [], fake_runner("node1|idle|none\n"))
    assert line == "  pending: waits for free nodes (Resources); it asks 2-3 node(s)"
    fields = {"JobState": "PENDING", "Reason": "QOSMaxNodePerJobLimit", "NumNodes": "4"}
    (line,) = shape_lines(fields, [], fake_runner(""))
    assert line == "  pending: waits (QOSMaxNodePerJobLimit); it asks 4 node(s)"
    assert shape_lines({"JobState": "RUNNING"}, [], fake_runner(SINFO)) == []


def test_status_says_the_worker_count_changed() -> None:
    fields = {"JobState": "RUNNING", "Reason": "None"}
    lines = shape_lines(fields, [cluster(3, 0), cluster(2, 1)], fake_runner(""))
    assert lines == ["  2 workers (was 3 before restart 1)"]


def test_a_range_renders_no_task_count_and_sets_it_in_the_step() -> None:
    spec = JobSpec(kind="model", target="mnist", nodes=2, max_nodes=4, gpus_per_node=4)
    lines = jobspec.render_sbatch(spec, "/usr/bin/python3").splitlines()
    assert "#SBATCH --nodes=2-4" in lines
    assert "#SBATCH --mincpus=4" in lines
    assert not [line for line in lines if "ntasks" in line and line.startswith("#SBATCH")]
    (srun,) = [line for line in lines if line.startswith("srun ")]
    assert "--ntasks-per-node=4" in srun
    assert "--gpu-bind=per_task:1" in srun
    fixed = JobSpec(kind="model", target="mnist", nodes=2, gpus_per_node=4)
    lines = jobspec.render_sbatch(fixed, "/usr/bin/python3").splitlines()
    assert "#SBATCH --nodes=2" in lines
    assert "#SBATCH --ntasks-per-node=4" in lines
    assert not [line for line in lines if "mincpus" in line]


def test_submit_dry_run_of_a_range() -> None:
    out = io.StringIO()
    assert submit_cli.main(["--dry_run", "--model=mnist", "--nodes=2-4"], out) == 0
    text = out.getvalue()
    assert "# sbatch script (2-4 tasks: 2-4 nodes x 1)" in text
    assert "#SBATCH --nodes=2-4" in text
    assert "--ntasks-per-node=1" in text


def test_a_range_with_gpus_per_task_is_refused() -> None:
    with pytest.raises(InputError, match=r"--gpu_flag='gpus-per-task'.*HINT: "):
        JobSpec(
            kind="model", target="mnist", nodes=2, max_nodes=4, gpus_per_node=2,
            gpu_flag="gpus-per-task",
        )  # fmt: skip


def step_tasks(env: dict[str, str]) -> str:
    """The supervisor's task flags for the first step, as ``srun FLAGS``."""
    job = JobSettings.read("train", env)
    flags, _ = supervisor_tasks(job, job.num_nodes)
    return " ".join(["srun", *flags])


@pytest.mark.parametrize(
    ("env", "srun"),
    [
        # a task count of the job's own: srun gets it from Slurm, as before
        ({"SLURM_NTASKS": "4", "SLURM_JOB_NUM_NODES": "2"}, "srun "),
        # none (the job scripts; a --nodes range): one task per GPU on the nodes it got
        ({"SLURM_JOB_NUM_NODES": "3", "SLURM_GPUS_ON_NODE": "1", CPUS: "1(x3)"},
         "srun --nodes=3 --ntasks-per-node=1 --ntasks=3"),
        ({"SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "4", CPUS: "4(x2)"},
         "srun --nodes=2 --ntasks-per-node=4 --ntasks=8"),
        ({"SLURM_JOB_NUM_NODES": "3", CPUS: "1(x3)"},
         "srun --nodes=3 --ntasks-per-node=1 --ntasks=3"),
        ({"SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "4", "TASKS_PER_NODE": "1",
          CPUS: "1(x2)"}, "srun --nodes=2 --ntasks-per-node=1 --ntasks=2"),
        # fewer CPUs on a node than its tasks (no DefCpuPerGPU): they share them
        ({"SLURM_JOB_NUM_NODES": "3", "SLURM_GPUS_ON_NODE": "4", CPUS: "4,1(x2)"},
         "srun --nodes=3 --ntasks-per-node=4 --ntasks=12 --overcommit"),
    ],
)  # fmt: skip
def test_the_step_task_count_follows_the_allocation(env: dict[str, str], srun: str) -> None:
    assert step_tasks(env) == srun.strip()


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"SLURM_JOB_NUM_NODES": "2", "TASKS_PER_NODE": "two"}, "TASKS_PER_NODE='two'"),
        ({"SLURM_JOB_NUM_NODES": "2", "TASKS_PER_NODE": "0"}, "TASKS_PER_NODE='0'"),
        ({"SLURM_JOB_NUM_NODES": "2", CPUS: "4(x)"}, "SLURM_JOB_CPUS_PER_NODE='4(x)'"),
    ],
)  # fmt: skip
def test_a_step_that_cannot_run_stops_with_a_hint(env: dict[str, str], words: str) -> None:
    with pytest.raises(InputError) as caught:
        step_tasks(env)
    assert words in str(caught.value)
    assert "HINT: " in str(caught.value)


def test_the_worker_count_of_the_last_start_is_kept_in_the_model_dir(tmp_path: Path) -> None:
    from slurmtf.training import checkpoints

    model_dir = str(tmp_path / "model")
    assert checkpoints.previous_workers(model_dir) is None  # the first start
    assert checkpoints.previous_workers(None) is None
    checkpoints.record_workers(model_dir, 3)
    assert checkpoints.previous_workers(model_dir) == 3
    checkpoints.record_workers(model_dir, 2)
    assert checkpoints.previous_workers(model_dir) == 2
    assert [p.name for p in (tmp_path / "model").iterdir()] == [checkpoints.WORKERS_FILE]
    (tmp_path / "model" / checkpoints.WORKERS_FILE).write_text("{not json")
    assert checkpoints.previous_workers(model_dir) is None
