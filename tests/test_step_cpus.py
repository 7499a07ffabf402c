"""The CPUs of a step whose tasks the job did not count (slurmtf.cluster.step_flags
``cpu_flags``, the supervisor's ``step_tasks``): the job scripts ask no task count, so
``sbatch -N2 --gres=gpu:4`` gets the CPUs of one task a node, and the step's workers (one
per GPU) take the CPUs the allocation has. The environments are the batch step's, as
measured on the sandbox (2 nodes of 8 CPUs and 4 GPUs; docs/SLURM_VERSIONS.md). No Slurm,
no TensorFlow.
"""

from __future__ import annotations

import pytest

from slurmtf.cluster.step_flags import SHARE_CPUS, cpu_flags
from slurmtf.errors import InputError
from slurmtf.runtime.job.commands import rank_command
from slurmtf.runtime.job.settings import JobSettings
from slurmtf.runtime.job.srun_flags import cpus_note, step_tasks
from slurmtf.runtime.job.step_nodes import first_placement
from slurmtf.runtime.job.supervisor import Supervisor

SPLIT = "--cpus-per-task"


@pytest.mark.parametrize(
    ("tasks", "cpus", "per_task", "flags"),
    [
        (4, "1(x2)", "", (SHARE_CPUS,)),  # -N2 --gres=gpu:4, no DefCpuPerGPU (CR_CPU)
        (4, "2(x2)", "", (SHARE_CPUS,)),  # the same, CR_Core with 2 threads a core
        (4, "8(x2)", "", ()),  # DefCpuPerGPU=2
        (4, "4(x2)", "", ()),  # --cpus-per-gpu=1
        (4, "2(x2)", "2", (SHARE_CPUS,)),  # -c 2: 2 CPUs a node
        (4, "4(x2)", "4", (f"{SPLIT}=1",)),  # -c 4: 4 CPUs a node, one each
        (4, "8(x2)", "8", (f"{SPLIT}=2",)),  # -c 8
        (4, "16(x2)", "2", ()),  # -c 2 --mincpus=16: fits as asked
        (1, "1(x2)", "", ()),  # --gres=none: one task a node
        (2, "4,3", "", ()),  # CR_CPU --cpus-per-gpu=1 --ntasks-per-node=1 gave 4,3
        (4, "4,3", "", (SHARE_CPUS,)),  # the fewest count decides
        (1, "4,3", "4", (f"{SPLIT}=3",)),
        (4, "", "", ()),  # outside Slurm: nothing to say
    ],
)
def test_the_steps_cpus_follow_the_allocation(
    tasks: int, cpus: str, per_task: str, flags: tuple[str, ...]
) -> None:
    assert cpu_flags(tasks, cpus, per_task) == flags


def test_a_bad_cpu_count_names_the_variable() -> None:
    with pytest.raises(InputError, match=r"SLURM_JOB_CPUS_PER_NODE='4\(x\)'.*HINT: "):
        cpu_flags(4, "4(x)")


JOB = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[1-2]",
       "PYTHON": "python3", "LOG_DIR": "/l"}  # fmt: skip
# Each form's batch environment as measured (22.05.8 and 26.05.3 alike unless named).
MEASURED = {
    "--gres=gpu:4 (CR_CPU)": {"SLURM_JOB_CPUS_PER_NODE": "1(x2)", "SLURM_GPUS_ON_NODE": "4"},
    "--gres=gpu:4 (CR_Core, 2 threads a core)": {
        "SLURM_JOB_CPUS_PER_NODE": "2(x2)", "SLURM_GPUS_ON_NODE": "4"},
    "--gres=gpu:4 (DefCpuPerGPU=2)": {
        "SLURM_JOB_CPUS_PER_NODE": "8(x2)", "SLURM_GPUS_ON_NODE": "4"},
    "--gres=gpu:4 --cpus-per-gpu=1": {
        "SLURM_JOB_CPUS_PER_NODE": "4(x2)", "SLURM_GPUS_ON_NODE": "4", "SLURM_CPUS_PER_GPU": "1"},
    "--gres=gpu:4 -c 8 (26.05)": {
        "SLURM_JOB_CPUS_PER_NODE": "8(x2)", "SLURM_GPUS_ON_NODE": "4", "SLURM_CPUS_PER_TASK": "8",
        "SLURM_TRES_PER_TASK": "cpu=8"},
    "--gres=gpu:4 -c 8 (22.05)": {
        "SLURM_JOB_CPUS_PER_NODE": "8(x2)", "SLURM_GPUS_ON_NODE": "4", "SLURM_CPUS_PER_TASK": "8"},
    "--gres=none": {"SLURM_JOB_CPUS_PER_NODE": "1(x2)"},
    "--gres=none --gpus-per-node=4": {
        "SLURM_JOB_CPUS_PER_NODE": "1(x2)", "SLURM_GPUS_ON_NODE": "4"},
    "--gres=none TASKS_PER_NODE=4": {"SLURM_JOB_CPUS_PER_NODE": "1(x2)", "TASKS_PER_NODE": "4"},
    "--gres=gpu:4 --ntasks-per-node=1": {
        "SLURM_JOB_CPUS_PER_NODE": "1(x2)", "SLURM_GPUS_ON_NODE": "4", "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "1"},
}  # fmt: skip
TASKS = "--nodes=2 --ntasks-per-node={} --ntasks={}"
# form -> the supervisor's task and CPU flags of the first step, and its job log's hint
EXPECTED = {
    "--gres=gpu:4 (CR_CPU)": (f"{TASKS.format(4, 8)} {SHARE_CPUS}", "--cpus-per-gpu=N"),
    "--gres=gpu:4 (CR_Core, 2 threads a core)": (
        f"{TASKS.format(4, 8)} {SHARE_CPUS}", "--cpus-per-gpu=N"),
    "--gres=gpu:4 (DefCpuPerGPU=2)": (TASKS.format(4, 8), ""),
    "--gres=gpu:4 --cpus-per-gpu=1": (TASKS.format(4, 8), ""),
    "--gres=gpu:4 -c 8 (26.05)": (f"{TASKS.format(4, 8)} {SPLIT}=2", ""),
    "--gres=gpu:4 -c 8 (22.05)": (f"{TASKS.format(4, 8)} {SPLIT}=2", ""),
    "--gres=none": (TASKS.format(1, 2), ""),
    "--gres=none --gpus-per-node=4": (f"{TASKS.format(4, 8)} {SHARE_CPUS}", "--cpus-per-gpu=N"),
    "--gres=none TASKS_PER_NODE=4": (f"{TASKS.format(4, 8)} {SHARE_CPUS}", "--mincpus=4"),
    "--gres=gpu:4 --ntasks-per-node=1": ("", ""),  # the job's own count: Slurm's CPUs
}  # fmt: skip


@pytest.mark.parametrize("form", MEASURED)
def test_every_form_gets_a_step_that_runs(form: str) -> None:
    job = JobSettings.read("train", {**JOB, **MEASURED[form]})
    flags, _ = step_tasks(job, job.num_nodes)
    srun, hint = EXPECTED[form]
    assert " ".join(flags) == srun
    note = cpus_note(job, flags)
    assert (hint in note) if hint else note == ""
    if note:
        cpus = MEASURED[form]["SLURM_JOB_CPUS_PER_NODE"]
        assert note.startswith(f"4 task(s) per node share the job's CPUs ({cpus} per node; ")
        assert "HINT: " in note


def test_the_supervisor_asks_srun_for_the_share_and_keeps_the_gpu_binding() -> None:
    """The mission's form: 4 workers per node on 1 CPU, each bound to its own GPU."""
    environ = {**JOB, **MEASURED["--gres=gpu:4 (CR_CPU)"], "SLURMTF_RESV_PORTS": "0"}
    job = JobSettings.read("train", environ)
    supervisor = Supervisor(job, ["show.py"], environ, lambda *a, **k: "")
    supervisor.nodes, supervisor.place = first_placement(job)
    args = supervisor.step_args(rank_command(job, ["show.py"]))
    assert SHARE_CPUS in args
    assert "--gpu-bind=per_task:1" in args
    assert "--ntasks-per-node=4" in args


def test_a_restart_on_fewer_nodes_keeps_the_cpu_flags() -> None:
    job = JobSettings.read("train", {**JOB, **MEASURED["--gres=gpu:4 -c 8 (26.05)"]})
    flags, per_node = step_tasks(job, 1)
    assert flags == ["--nodes=1", "--ntasks-per-node=4", "--ntasks=4", f"{SPLIT}=2"]
    assert per_node == "4"
