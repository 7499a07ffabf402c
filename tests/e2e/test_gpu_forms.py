"""End-to-end: the README's GPU forms on a cluster's own CPU settings, with no CPU arithmetic.

``sbatch -N2 --gres=gpu:4 jobs/resnet.sbatch`` asks no task count and no CPUs (a
``--nodes=MIN-MAX`` range must stay free to get every node), so Slurm gives it the CPUs
of one task a node, unless the site sets ``DefCpuPerGPU``: 1 CPU a node on CR_CPU, one core
(2 CPUs here) on CR_Core. The supervisor still starts one worker per GPU: the workers take
the CPUs the allocation has (split, or shared with ``srun --overcommit``, which the job log
says with the fix). A site's ``DefCpuPerGPU`` and the user's ``--cpus-per-task`` or
``--cpus-per-gpu`` decide the CPUs, never slurmtf.

Three sandboxes of 4 nodes, each of 8 CPUs (2 threads a core) and 4 fake GPUs, as sites
set them (``SITES``), one at a time; every job takes 2 nodes, so two run side by side. The
ranks are light: the bundled models' ``--placement_only`` (``resnet.sbatch``,
``mnist.sbatch``, ``submit --model``) or a user's script that prints its place
(tests/scripts/show_place.py, through ``jobs/train.sbatch`` and ``submit --command``).
Each job must end COMPLETED with one worker per GPU (or what the form says), each on its
own GPUs, the CPUs a node that the site's settings and the user's options give, and the
job log's word on shared CPUs exactly when the workers share them.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from slurmtf.cluster.ports import free_port_base
from slurmtf.events import named, read_events
from slurmtf.sandbox import Sandbox
from slurmtf.slurm.scontrol import parse_records
from tests.e2e.conftest import REPO, SlurmSandbox, require_sandbox_prereqs
from tests.e2e.jobruns import SandboxJob

pytestmark = [pytest.mark.slurm, pytest.mark.matrix]

PY = sys.executable
NODES = 2  # per job; each sandbox has twice the nodes
SCRIPT = str(REPO / "tests" / "scripts" / "show_place.py")
PLACE = ("--placement_only",)
ONE_EACH = ("0", "1", "2", "3")
SHARED = "share the job's CPUs"
# How each sandbox's nodes hand out CPUs (slurm.conf), as sites leave or set it.
SITES: dict[str, dict[str, Any]] = {
    "CR_Core": {"select_type_parameters": "CR_Core"},
    "CR_CPU": {"select_type_parameters": "CR_CPU"},
    "DefCpuPerGPU": {"select_type_parameters": "CR_Core", "def_cpu_per_gpu": 2},
}


@dataclass(frozen=True)
class Form:
    """A way to ask for GPUs: ``sbatch OPTIONS jobs/SCRIPT ARGS`` or ``python -m
    slurmtf.submit OPTIONS -- ARGS``, the workers a node and each one's GPUs it gives."""

    script: str  # a job script, or "submit"
    options: tuple[str, ...]
    args: tuple[str, ...]
    per_node: int
    gpus: tuple[str | None, ...]  # each worker's CUDA_VISIBLE_DEVICES on a node
    counted: bool = False  # the job asks a task count: Slurm's CPUs fit its tasks
    per_task: str | None = None  # the SLURM_CPUS_PER_TASK each worker sees, when checked


FORMS = {
    "mission": Form("resnet.sbatch", ("--gres=gpu:4",), PLACE, 4, ONE_EACH),
    "script": Form("train.sbatch", ("--gres=gpu:4",), (SCRIPT,), 4, ONE_EACH),
    "cpu-only": Form("train.sbatch", ("--gres=none",), (SCRIPT,), 1, (None,)),
    "gpus-per-node": Form("mnist.sbatch", ("--gres=none", "--gpus-per-node=4"), PLACE, 4, ONE_EACH),
    "gpus-per-task": Form(
        "mnist.sbatch", ("--gres=none", "--gpus-per-task=1", "--ntasks-per-node=4"), PLACE, 4,
        ONE_EACH, counted=True,
    ),
    "one-worker": Form(
        "resnet.sbatch", ("--gres=gpu:4", "--ntasks-per-node=1"), PLACE, 1, ("0,1,2,3",),
        counted=True,
    ),
    "user -c 2": Form("train.sbatch", ("--gres=gpu:4", "-c", "2"), (SCRIPT,), 4, ONE_EACH),
    "user -c 8": Form(
        "train.sbatch", ("--gres=gpu:4", "-c", "8"), (SCRIPT,), 4, ONE_EACH, per_task="2"
    ),
    "user --cpus-per-gpu=1": Form(
        "train.sbatch", ("--gres=gpu:4", "--cpus-per-gpu=1"), (SCRIPT,), 4, ONE_EACH
    ),
    "submit --model": Form(
        "submit", ("--model=mnist", "--gpus_per_node=4"), PLACE, 4, ONE_EACH, counted=True
    ),
    "submit --command": Form(
        "submit", (f"--command=python {SCRIPT}", "--gpus_per_node=4"), (), 4, ONE_EACH,
        counted=True,
    ),
    "submit --cpus_per_task=2": Form(
        "submit", (f"--command=python {SCRIPT}", "--gpus_per_node=4", "--cpus_per_task=2"), (),
        4, ONE_EACH, counted=True, per_task="2",
    ),
    "submit --cpus_per_gpu=1": Form(
        "submit", (f"--command=python {SCRIPT}", "--gpus_per_node=4", "--cpus_per_gpu=1"), (),
        4, ONE_EACH, counted=True,
    ),
}  # fmt: skip
# site -> form -> the CPUs a node the job gets (measured on 22.05.8 and 26.05.3 alike)
CPUS: dict[str, dict[str, int]] = {
    "CR_Core": {
        "mission": 2, "script": 2, "cpu-only": 2, "gpus-per-node": 2, "gpus-per-task": 4,
        "one-worker": 2, "user -c 2": 2, "user -c 8": 8, "user --cpus-per-gpu=1": 4,
        "submit --model": 4, "submit --command": 4, "submit --cpus_per_task=2": 8,
    },
    "CR_CPU": {"mission": 1, "cpu-only": 1, "gpus-per-node": 1, "submit --model": 4},
    "DefCpuPerGPU": {  # the site's 2 a GPU, unless the user asks otherwise
        "mission": 8, "cpu-only": 2, "user -c 2": 2, "user --cpus-per-gpu=1": 4,
        "submit --command": 8, "submit --cpus_per_gpu=1": 4,
    },
}  # fmt: skip
CASES = [(site, form) for site, forms in CPUS.items() for form in forms]


@dataclass
class Run:
    """One submitted form: its job id, where its ranks' stdout lands, its job log."""

    sandbox: SlurmSandbox
    job_id: str
    outputs: list[Path]  # each rank's stdout, in rank order (as many as there may be)
    job_log: Path
    job: SandboxJob | None = None  # the sbatch forms

    def finish(self) -> str:
        return self.sandbox.wait(self.job_id, timeout=240)

    def placements(self) -> dict[int, dict[str, Any]]:
        found = [named(read_events(path), "placement") for path in self.outputs]
        return {events[0]["rank"]: events[0] for events in found if events}

    def cpus_per_node(self) -> int:
        show = self.sandbox.run(["scontrol", "-o", "show", "job", self.job_id])
        record = parse_records(show.stdout)[0]
        return int(record["NumCPUs"]) // int(record["NumNodes"])

    def report(self) -> str:
        if self.job is not None:
            return self.job.report()
        texts = [f"--- {p}:\n{p.read_text()[-2000:]}" for p in self.outputs if p.exists()]
        log = self.job_log.read_text()[-3000:] if self.job_log.exists() else ""
        return "\n".join([f"--- job log {self.job_log}:\n{log}", *texts,
                          self.sandbox.logs(self.job_id)])  # fmt: skip


def submit(sbx: SlurmSandbox, root: Path, name: str, form: Form) -> Run:
    """Submit ``form`` on 2 nodes, its ranks on ports of their own (jobs run side by side)."""
    env = {"SLURMTF_PORT_BASE": str(free_port_base(NODES * 4))}
    run_dir = root / re.sub(r"[^\w]+", "_", name)
    if form.script != "submit":
        job = SandboxJob(sbx, run_dir, nodes=NODES)
        sbatch = [*form.options, "--time=5"]
        job.submit(form.args, script=form.script, tasks_per_node=None, sbatch_args=sbatch, env=env)
        outputs = [job.log_dir / f"rank{r}.out" for r in range(NODES * form.per_node)]
        log = job.run_dir / f"{run_dir.name}-{job.job_id}.out"
        return Run(sbx, job.job_id, outputs, log, job)
    done = sbx.run(
        [PY, "-m", "slurmtf.submit", f"--nodes={NODES}", "--time=5", f"--log_dir={run_dir}",
         *form.options, *(["--", *form.args] if form.args else [])],
        timeout=120, env=env,
    )  # fmt: skip
    match = re.search(r"submitted job (\d+)", done.stdout)
    assert match, done.stdout + done.stderr
    job_id = match.group(1)
    outputs = [run_dir / f"{job_id}_{r}_log.out" for r in range(NODES * form.per_node)]
    return Run(sbx, job_id, outputs, run_dir / f"{job_id}_0_log.err")


class Sites:
    """One sandbox at a time: the first test of a site starts it and submits every form
    of that site at once (they queue for two nodes); the next site stops it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.site = ""
        self.sandbox: Sandbox | None = None
        self.runs: dict[str, Run] = {}

    def run(self, site: str, form: str) -> Run:
        if site != self.site:
            self.close()
            sandbox = Sandbox(self.root / site, nodes=2 * NODES, gpus_per_node=4,
                              threads_per_core=2, **SITES[site])  # fmt: skip
            sandbox.up()
            self.site, self.sandbox = site, sandbox
            sbx = SlurmSandbox(sandbox)
            self.runs = {name: submit(sbx, self.root / site, name, FORMS[name])
                         for name in CPUS[site]}  # fmt: skip
        return self.runs[form]

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.down()
        self.sandbox, self.site, self.runs = None, "", {}


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sites]:
    require_sandbox_prereqs()
    held = Sites(tmp_path_factory.mktemp("sites"))
    try:
        yield held
    finally:
        held.close()


@pytest.mark.parametrize(("site", "name"), CASES, ids=[f"{s}-{f}" for s, f in CASES])
def test_every_gpu_form_starts_its_workers_on_the_sites_cpus(
    sites: Sites, site: str, name: str
) -> None:
    form, run = FORMS[name], sites.run(site, name)
    assert run.finish() == "COMPLETED", run.report()
    seen = run.placements()
    ranks = list(range(NODES * form.per_node))
    assert sorted(seen) == ranks, run.report()
    assert [seen[r]["cuda_visible_devices"] for r in ranks] == list(form.gpus) * NODES
    nodes = [seen[r]["node"] for r in ranks]
    assert nodes == [n for n in dict.fromkeys(nodes) for _ in range(form.per_node)]
    cpus = run.cpus_per_node()
    assert cpus == CPUS[site][name], run.report()
    if form.per_task is not None:
        assert {seen[r]["cpus_per_task"] for r in ranks} == {form.per_task}, run.report()
    assert not any(seen[r].get("tensorflow") for r in ranks)  # light ranks, as meant
    if form.script != "submit":  # the job scripts' supervisor says when workers share
        shares = not form.counted and cpus < form.per_node
        assert (SHARED in run.job_log.read_text()) == shares, run.report()
