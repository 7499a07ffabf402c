"""Every command the README and the job scripts show runs, as a user would type it.

The commands are read from README.md, jobs/README.md and the usage lines of
jobs/*.sbatch; the test fails when a documented command is missing from ``COMMANDS``
below (or listed there but no longer documented), so docs and test cannot drift apart.
Each one runs on a sandbox of 16 nodes with 4 fake GPUs each, at tiny sizes: model
flags that shorten the run are appended (the last value of a flag wins), the example
paths (``/data/...``, ``/shared/...``) point to small files this test writes, and
outputs go to a temporary folder. sbatch jobs must end COMPLETED with every rank done
and the same weights on every rank (``check_training``).
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurmtf.events import named, read_events
from slurmtf.sandbox import Sandbox
from tests.e2e.conftest import PYTHON, REPO, SlurmSandbox, require_sandbox_prereqs
from tests.e2e.jobruns import SandboxJob, check_clean_end, check_training

pytestmark = [pytest.mark.slurm, pytest.mark.tf, pytest.mark.slow, pytest.mark.readme]

DOCS = ("README.md", "jobs/README.md", "jobs/mnist.sbatch", "jobs/resnet.sbatch")
TINY = {
    "mnist": ["--train_steps=4", "--eval_steps=1", "--log_every=2", "--num_threads=1"],
    "resnet": ["--train_steps=2", "--eval_steps=1", "--log_every=1", "--num_threads=1",
               "--image_size=32", "--batch_size=16"],
}  # fmt: skip


def tiny(model: str, command: str) -> list[str]:
    """The flags that make a documented command's training tiny: few steps, small batches
    and images; a ResNet the command does not size is ResNet-20 (ResNet-56, the default,
    runs where a command names it: its first trace alone is a minute of this machine)."""
    if model == "resnet" and "--resnet_size" not in command:
        return [*TINY[model], "--resnet_size=20"]
    return TINY[model]


@dataclass(frozen=True)
class Doc:
    """How a documented command is run here: a job's shape, or why it is not run."""

    nodes: int = 0  # sbatch jobs: nodes and tasks per node the command asks for
    per_node: int = 1
    # GPU request forms of many workers and ResNet-50: the job runs the model's
    # --placement_only (resolve, GPU plan, no TensorFlow) and every rank must hold its
    # own GPU(s); training in those forms is tests/e2e/test_gpu_binding.py's and
    # test_width.py's, ResNet-50's tests/integration/test_models_train.py's.
    placement: bool = False
    not_run: str = ""  # the reason a command is not executed by this test


COMMANDS: dict[str, Doc] = {
    "bash scripts/demo.sh": Doc(not_run="runs in test_demo (tests/e2e/test_demo.py)"),
    "bash scripts/test.sh": Doc(not_run="the command that runs this very test"),
    "bash scripts/build-slurm.sh ../shared/slurm/slurm-26.05.3.tar.xz": Doc(
        not_run="scripts/test.sh runs it before the version matrix (a build, or its reuse); "
        "tests/test_build_slurm.py checks its refusals and the reuse"
    ),
    "SLURMTF_SLURM_MATRIX=/opt/slurm-26.05.3,/opt/slurm-25.11.7,debian bash scripts/matrix.sh": Doc(
        not_run="scripts/test.sh runs scripts/matrix.sh on 26.05.3 beside this suite; 25.11.7 "
        "by the same command (docs/SLURM_VERSIONS.md has its result)"
    ),
    "bash scripts/tf-venv.sh 2.17": Doc(
        not_run="scripts/test.sh runs it for the oldest release (2.15) before the suite; "
        "tests/test_tf_venv.py checks its refusals and the reuse"
    ),
    "SLURMTF_TF_MATRIX=2.15,2.16,2.17,2.18,2.19,2.20,2.21 bash scripts/matrix.sh": Doc(
        not_run="scripts/test.sh runs scripts/matrix.sh with 2.15 beside this suite; every "
        "release by the same command (docs/TENSORFLOW_VERSIONS.md has the results)"
    ),
    'pip install "slurmtf[gpu] @ git+<this repository>"': Doc(
        not_run="a placeholder address and the CUDA wheel; the CPU install is what CI does"
    ),
    'pip install "slurmtf[cpu] @ git+<this repository>"': Doc(
        not_run="a placeholder address; scripts/setup.sh installs the same extra from the checkout"
    ),
    "slurmtf job-scripts .": Doc(
        not_run="would write into the checkout; tests/e2e/test_installed.py runs it, installed"
    ),
    "sbatch mnist.sbatch": Doc(
        not_run="the folder of `slurmtf job-scripts .`: tests/e2e/test_installed.py runs it"
    ),
    "sbatch jobs/mnist.sbatch": Doc(nodes=2),
    "sbatch jobs/mnist.sbatch --train_steps=200": Doc(nodes=2),
    "sbatch -N1 jobs/mnist.sbatch --train_steps=200": Doc(nodes=1),
    "sbatch -N4 --gres=gpu:4 --ntasks-per-node=4 jobs/mnist.sbatch --batch_size=800": Doc(
        nodes=4, per_node=4, placement=True
    ),
    "MODEL_DIR=/shared/mnist1 DATA_DIR=/data/mnist sbatch jobs/mnist.sbatch --train_epochs=10": Doc(
        nodes=2
    ),
    "sbatch --gres=none jobs/mnist.sbatch": Doc(nodes=2),
    "sbatch -N2 --gres=none --gpus-per-task=1 --ntasks-per-node=4 jobs/mnist.sbatch": Doc(
        nodes=2, per_node=4, placement=True
    ),
    "sbatch -N2 --gres=none --gpus-per-node=4 jobs/mnist.sbatch": Doc(
        nodes=2, per_node=4, placement=True
    ),
    "sbatch -N2 --gres=gpu:4 --ntasks-per-node=1 jobs/mnist.sbatch": Doc(nodes=2),
    "sbatch jobs/resnet.sbatch": Doc(nodes=2),
    "sbatch jobs/resnet.sbatch --resnet_size=20 --train_steps=100": Doc(nodes=2),
    "sbatch -N1 jobs/resnet.sbatch --resnet_size=56": Doc(nodes=1),
    "sbatch -N2 --gres=gpu:4 jobs/resnet.sbatch --resnet_size=50 "
    "--dtype=bf16 --data_dir=/data/imagenet": Doc(nodes=2, per_node=4, placement=True),
    "sbatch -N2 --gres=gpu:4 jobs/resnet.sbatch": Doc(nodes=2, per_node=4, placement=True),
    "sbatch -N2 --gres=gpu:4 --cpus-per-gpu=8 jobs/resnet.sbatch --resnet_size=50 "
    "--dtype=bf16 --data_dir=/data/imagenet": Doc(nodes=2, per_node=4, placement=True),
    "sbatch -N2 --gres=gpu:4 --ntasks-per-node=1 jobs/resnet.sbatch --resnet_size=50": Doc(
        nodes=2, placement=True
    ),
    "sbatch --nodes=2-4 --gres=gpu:4 jobs/resnet.sbatch": Doc(nodes=4, per_node=4, placement=True),
    "MODEL_DIR=/shared/r56 DATA_DIR=/data/cifar-10-batches-bin sbatch jobs/resnet.sbatch": Doc(
        nodes=2
    ),
    "sbatch --gres=none jobs/resnet.sbatch": Doc(nodes=2),
    "sbatch jobs/train.sbatch examples/tf_tutorial.py": Doc(
        not_run="runs in test_bring_your_own.py (tutorial: 2 nodes vs one worker)"
    ),
    'python -m slurmtf.submit --nodes=2 --command="python examples/tf_tutorial.py"': Doc(
        not_run="runs in test_bring_your_own.py (submit --command: 2 nodes vs one worker)"
    ),
    "python -m slurmtf.submit --model=mnist --nodes=2 --gpus_per_node=4 --time=30 --wait": Doc(),
    "python -m slurmtf.submit --model=resnet50 --nodes=2 --gpus_per_node=4 --gpus_per_task=4 "
    "-- --dtype=bf16": Doc(),
    "python -m slurmtf.submit --model=resnet20 --nodes=1 --gpus_per_node=2 "
    "--sweep=learning_rate=0.1,0.05 --sweep=batch_size=256,512 --array_parallelism=2": Doc(),
    "python -m slurmtf.submit --dry_run --model=mnist --nodes=2 --gpus_per_node=4 --time=30": Doc(),
    "slurmtf status JOB": Doc(),
    "slurmtf logs JOB --follow": Doc(),
    "slurmtf plot JOB": Doc(),
    "slurmtf cancel JOB": Doc(),
    "slurmtf sweep ARRAY --sort=accuracy": Doc(),
    "STAGE_DATA=1 sbatch jobs/mnist.sbatch --data_dir=/data/mnist": Doc(nodes=2),
    "slurmtf check --nodes=4": Doc(
        not_run="runs in tests/e2e/test_check.py (4 nodes, one at a tenth of the link rate)"
    ),
    "slurmtf sandbox link node3 100mbit": Doc(
        not_run="needs a sandbox with --link: tests/e2e/test_check.py runs it (node3 1gbit)"
    ),
    "sbatch jobs/parameter_server.sbatch examples/parameter_server.py": Doc(
        not_run="runs in test_parameter_server.py (3 nodes: completes, killed worker, killed ps)"
    ),
    'python -m slurmtf.submit --command="python examples/parameter_server.py" '
    "--jobs=chief:1,ps:2,worker:2 --nodes=3": Doc(
        not_run="runs in test_parameter_server.py (submit --jobs)"
    ),
    "SLURMTF_JOBS=chief:1@0,ps@0,worker@1 sbatch -N1 -n3 : -N2 --ntasks-per-node=1 "
    "jobs/parameter_server.sbatch examples/parameter_server.py": Doc(
        not_run="runs in test_parameter_server.py (the heterogeneous form)"
    ),
    "sbatch -N3 jobs/mnist.sbatch --evaluator": Doc(
        not_run="runs in test_evaluator.py (its checks are the evaluator's, not check_training's)"
    ),
    "sbatch --nodes=2-3 jobs/mnist.sbatch": Doc(
        not_run="runs in test_node_range.py (a node drained and its rank killed mid-run)"
    ),
    "python -m slurmtf.submit --model=mnist --nodes=2-3": Doc(
        not_run="test_node_range.py runs submit --nodes=2-3 (every free node, 2 tasks each)"
    ),
    'eval "$(python -m slurmtf.resolver --export)"': Doc(),
    "python -m slurmtf.resolver --explain": Doc(),
    "python -m slurmtf.resolver --flags": Doc(),
}

_FENCE = re.compile(r"```(?:bash|sh|console)\n(.*?)```", re.S)
_LEADS = ("sbatch ", "python -m ", "slurmtf ", "bash scripts/", "pip install ", "eval ")


def _commands_in(text: str) -> list[str]:
    """Shell lines of ``text`` joined over ``\\``, comments and placeholders removed."""
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        for part in line.split("; "):
            command = re.sub(r"\s+#\s.*$", "", part).replace("[MODEL FLAGS...]", "")
            command = " ".join(command.split())
            bare = re.sub(r"^([A-Z_]+=\S+ )+", "", command)
            if bare.startswith(_LEADS):
                found.append(command)
    return found


def documented_commands() -> set[str]:
    found: set[str] = set()
    for name in DOCS:
        text = (REPO / name).read_text()
        if name.endswith(".md"):
            for block in _FENCE.findall(text):
                found.update(_commands_in(block))
        else:  # the usage lines at the top of a job script
            header = text.split("#SBATCH", 1)[0]
            usage = [line[1:] for line in header.splitlines() if line.startswith("#   ")]
            found.update(_commands_in("\n".join(usage).replace("\\\n ", "\\\n")))
    return found


def test_every_documented_command_is_run_or_says_why_not() -> None:
    documented = documented_commands()
    assert documented - set(COMMANDS) == set(), "documented but not run by this test"
    assert set(COMMANDS) - documented == set(), "run by this test but no longer documented"


# ---------------------------------------------------------------- running them


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    require_sandbox_prereqs()
    # 32 CPUs a node: room for the documented --cpus-per-gpu=8 on 4 GPUs
    sandbox = Sandbox(tmp_path_factory.mktemp("docs"), nodes=16, gpus_per_node=4, cpus_per_node=32)
    sandbox.up()
    try:
        yield SlurmSandbox(sandbox)
    finally:
        sandbox.down()


@pytest.fixture(scope="module")
def example_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The example paths of the docs, mapped to small real files."""
    from tests.helpers.datafiles import with_manifest, write_cifar, write_imagenet, write_mnist

    root = tmp_path_factory.mktemp("data")
    return {
        "/data/mnist": str(with_manifest(write_mnist(root / "mnist"))),
        "/data/cifar-10-batches-bin": str(write_cifar(root / "cifar")),
        "/data/imagenet": str(write_imagenet(root / "imagenet", side=32)),
        "/shared/": f"{root}/shared/",
    }


def localize(command: str, paths: dict[str, str]) -> str:
    for example, real in paths.items():
        command = command.replace(example, real)
    return command


def sbatch_commands() -> list[str]:
    return [c for c, doc in COMMANDS.items() if doc.nodes]


def slug(command: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", command.replace("jobs/", "")).strip("_")


def check_own_gpus(run: SandboxJob, per_node: int) -> None:
    """Every rank placed itself; no two ranks of a node hold the same GPU."""
    state = run.finish()
    placed = {rank: events[0] for rank, events in run.of("placement").items() if events}
    report = f"job {run.job_id} {state}: {placed}"
    assert state == "COMPLETED", report
    assert sorted(placed) == list(range(run.tasks)), report
    for node in range(run.nodes):
        shares = [
            placed[r]["cuda_visible_devices"] for r in range(node * per_node, (node + 1) * per_node)
        ]
        held = [gpu for share in shares for gpu in share.split(",") if gpu]
        assert len(held) == len(set(held)) >= per_node, f"GPUs shared on a node\n{report}"


@pytest.mark.parametrize("command", sbatch_commands(), ids=slug)
def test_documented_sbatch_command_runs(
    command: str, wide: SlurmSandbox, example_paths: dict[str, str], tmp_path: Path
) -> None:
    model = "resnet" if "resnet.sbatch" in command else "mnist"
    doc = COMMANDS[command]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {"MODEL_DIR": str(run_dir / "model"), "LOG_DIR": str(run_dir / "logs")}
    typed = localize(command, example_paths)
    env |= dict(re.findall(r"(?:^| )([A-Z_]+)=(\S+)(?= )", typed.split(" sbatch ")[0] + " "))
    argv = shlex.split(re.sub(r"^([A-Z_]+=\S+ )+", "", typed))
    argv[1:1] = ["--parsable", f"--output={run_dir}/%x-%j.out"]  # the id; no files in the repo
    extra = ["--placement_only"] if doc.placement else tiny(model, command)
    started = time.monotonic()
    job_id = wide.run([*argv, *extra], env=env).stdout.strip().split(";")[0]
    run = SandboxJob(
        wide, run_dir, job_id, nodes=doc.nodes, tasks=doc.nodes * doc.per_node, timeout=900,
        model_path=Path(env["MODEL_DIR"]), logs_path=Path(env["LOG_DIR"]),
    )  # fmt: skip
    if doc.placement:
        check_own_gpus(run, doc.per_node)
    else:  # two ResNet steps are too few to learn; MNIST's four are enough
        check_training(run, loss_falls=model == "mnist")
    print(f"MEASURED {command!r} {time.monotonic() - started:.1f}")


def _submit(
    wide: SlurmSandbox, command: str, cwd: Path, options: list[str], model: list[str]
) -> str:
    """Run a documented submit command with ``options`` added before its model flags."""
    argv = shlex.split(command)
    argv[0] = PYTHON if argv[0] == "python" else argv[0]
    cut = argv.index("--") if "--" in argv else len(argv)
    flags = [*argv[cut + 1 :], *model]
    argv = [*argv[:cut], *options, *(["--", *flags] if flags else [])]
    done = wide.run(argv, cwd=cwd, timeout=900, check=False)
    assert done.returncode == 0, f"{command} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_documented_submit_commands_and_job_commands(wide: SlurmSandbox, tmp_path: Path) -> None:
    """Submit with --wait, one worker per node, the sweep, the dry run; then status, logs
    and cancel by job id."""
    first, per_node, sweep, dry = [
        c for c in COMMANDS if c.startswith("python -m slurmtf.submit") and not COMMANDS[c].not_run
    ]
    out = _submit(wide, first, tmp_path, [], TINY["mnist"])
    job = re.search(r"submitted job (\d+)", out)
    assert job, out
    assert "final accuracy" in out, out
    check_submitted_mnist(wide, job.group(1), out)
    out = _submit(wide, per_node, tmp_path, ["--wait"], TINY["resnet"])
    assert "final accuracy" in out, out
    # The array's four points parse their flags and place their ranks; the per-node
    # command above trained through the same path (the sweep's mechanics: test_submit).
    out = _submit(wide, sweep, tmp_path, ["--wait"], ["--placement_only"])
    array = re.search(r"submitted job array (\d+)", out)
    assert array, out
    logs = re.findall(r"^  rank \d+: (\S+)$", out, re.M)
    assert len(logs) == 4 * 2, out  # 4 points x 2 ranks
    for log in logs:
        assert named(read_events(Path(log)), "placement"), log
    assert "#SBATCH" in _submit(wide, dry, tmp_path, [], [])
    table = wide.run(
        ["slurmtf", "sweep", array.group(1), "--sort=accuracy"], cwd=tmp_path, check=False
    )
    assert table.stdout.startswith(f"sweep {array.group(1)}: 4 points"), table
    jobs = ("slurmtf status JOB", "slurmtf logs JOB --follow", "slurmtf plot JOB")
    for command in (*jobs, "slurmtf cancel JOB"):
        argv = shlex.split(command)
        argv[argv.index("JOB")] = job.group(1)
        done = wide.run(argv, cwd=tmp_path, timeout=120, check=False)
        assert done.returncode == 0, f"{command}: {done.stdout}\n{done.stderr}"
    assert (tmp_path / f"{job.group(1)}.png").read_bytes().startswith(b"\x89PNG"), out


def check_submitted_mnist(wide: SlurmSandbox, job_id: str, out: str) -> None:
    """``--wait`` names each rank's logs: 8 workers (2 nodes x 4 GPUs) on two nodes with
    the default batch fitted to them, all at the last step, no error line, and the ranks
    left together."""
    found = re.findall(r"^  rank (\d+): (\S+\.out)  (\S+\.err)$", out, re.M)
    logs = {int(rank): [Path(o), Path(e)] for rank, o, e in found}
    assert sorted(logs) == list(range(8)), out
    for rank, (log, _) in logs.items():
        events = read_events(log)
        cluster = named(events, "cluster")[-1]
        assert cluster["global_batch"] == 96, cluster  # the default 100, fitted to 8 replicas
        workers = cluster["workers"]
        assert len(workers) == 8, workers
        assert len({w.rsplit(":", 1)[0] for w in workers}) == 2, workers
        assert named(events, "done")[-1]["step"] == 4, (rank, log)
    check_clean_end(wide, job_id, logs)


def test_documented_resolver_commands_in_a_job_step(wide: SlurmSandbox, tmp_path: Path) -> None:
    """The shell lines, then the README's Python snippet, on every task of a 2-node step."""
    script = (
        'eval "$(python -m slurmtf.resolver --export)"; '
        'python -c "import json, os; print(json.loads(os.environ[\\"TF_CONFIG\\"])[\\"task\\"])"; '
        "python -m slurmtf.resolver --explain; "
        "python -m slurmtf.resolver --flags"
    )
    done = wide.run(["srun", "-N2", "--ntasks-per-node=1", "bash", "-c", script], timeout=120)
    assert done.stdout.count("'type': 'worker'") == 2, done.stdout
    assert "node2" in done.stdout, done.stdout
    flags = re.findall(r"^--worker_hosts=(\S+) --task_index=(\d)$", done.stdout, re.M)
    assert sorted(index for _, index in flags) == ["0", "1"], done.stdout
    assert len({hosts for hosts, _ in flags}) == 1, done.stdout  # one worker list
    (snippet,) = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    program = tmp_path / "own_script.py"
    program.write_text(snippet + "print('replicas', strategy.num_replicas_in_sync)\n")
    done = wide.run(["srun", "-N2", "--ntasks-per-node=1", PYTHON, str(program)], timeout=300)
    assert done.stdout.count("replicas 2") == 2, done.stdout + done.stderr
