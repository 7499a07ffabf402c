"""The sidecar evaluator's pure parts and its flag and role checks (no TensorFlow)."""

from __future__ import annotations

import json

import pytest

from slurmtf.cluster.roles import assign_roles, parse_jobs
from slurmtf.errors import InputError
from slurmtf.runtime.rank.chief_watch import Chief, ChiefWatch
from slurmtf.training import checkpoints, sidecar
from tests.conftest import FakeSlurmEnv

STEP3 = {"SLURMTF_PORT_BASE": 23100, "SLURM_LOCALID": 0}


def test_evaluator_flag_makes_the_last_task_the_evaluator() -> None:
    assert sidecar.evaluator_jobs(3) == "worker:2,evaluator:1"
    assert assign_roles(parse_jobs(sidecar.evaluator_jobs(3)), 3) == (
        "worker",
        "worker",
        "evaluator",
    )
    with pytest.raises(InputError, match=r"^--evaluator=True: .* the step has 1\. HINT: "):
        sidecar.evaluator_jobs(1)


@pytest.mark.parametrize(
    ("jobs", "problem"),
    [
        ("chief:1,ps:1,worker:1,evaluator:1", "gives ps tasks, which the bundled models"),
        ("chief:1,ps:2,worker", "gives ps tasks"),
        ("evaluator:1", "gives no task a worker's role"),
    ],
)
def test_the_models_refuse_roles_they_do_not_run(jobs: str, problem: str) -> None:
    roles = assign_roles(parse_jobs(jobs), 4 if "ps:2" in jobs else len(jobs.split(",")))
    with pytest.raises(InputError) as caught:
        sidecar.check_model_roles(roles, jobs)
    message = str(caught.value)
    assert message.startswith(f"SLURMTF_JOBS={jobs!r}: {problem}"), message
    assert "HINT: use SLURMTF_JOBS=worker:N,evaluator:1" in message


def test_the_models_take_workers_with_or_without_an_evaluator() -> None:
    sidecar.check_model_roles(None, "")
    sidecar.check_model_roles(("worker", "worker", "evaluator"), "worker:2,evaluator:1")
    sidecar.check_model_roles(("chief", "worker", "evaluator"), "chief:1,worker:1,evaluator:1")


def test_two_evaluators_are_refused_with_the_value() -> None:
    with pytest.raises(InputError) as caught:
        assign_roles(parse_jobs("worker:2,evaluator:2"), 4)
    message = str(caught.value)
    assert message.startswith("SLURMTF_JOBS='worker:2,evaluator:2': gives 'evaluator' 2 tasks")
    assert "HINT: TensorFlow allows one evaluator" in message


@pytest.mark.parametrize(
    ("stop_threshold", "eval_only", "flag"),
    [(0.9, False, "--stop_threshold=0.9"), (None, True, "--eval_only=True")],
)
def test_flags_that_need_in_loop_evaluation(
    stop_threshold: float | None, eval_only: bool, flag: str
) -> None:
    with pytest.raises(InputError, match=rf"^{flag}: .*evaluat.*\. HINT: drop "):
        sidecar.check_sidecar_config(stop_threshold, eval_only)
    sidecar.check_sidecar_config(None, False)


def test_checkpoints_due_in_step_order_after_the_last() -> None:
    paths = ["/m/checkpoints/ckpt-30", "/m/checkpoints/ckpt-10", "/m/checkpoints/ckpt-20"]
    assert checkpoints.checkpoint_step("/m/checkpoints/ckpt-120") == 120
    assert checkpoints.checkpoint_step("/m/checkpoints/ckpt-12.index") is None
    assert checkpoints.checkpoint_step("/m/checkpoints/model") is None
    assert [step for step, _ in sidecar.due(paths, None)] == [10, 20, 30]
    assert sidecar.due(paths, 10) == [(20, paths[2]), (30, paths[0])]
    assert sidecar.due(paths, 30) == []
    assert sidecar.due([*paths, "/m/other"], 25) == [(30, paths[0])]


def test_training_tasks_and_the_chief() -> None:
    assert sidecar.training_tasks(("worker", "worker", "evaluator")) == 2
    assert sidecar.training_tasks(("chief", "worker", "evaluator")) == 2
    cluster = {"worker": ["node1:100", "node2:101"], "evaluator": ["node3:102"]}
    assert sidecar.chief_address(cluster) == Chief("node1", 100)
    assert sidecar.chief_address({**cluster, "chief": ["node9:99"]}) == Chief("node9", 99)
    assert sidecar.has_evaluator(("worker", "evaluator"))
    assert not sidecar.has_evaluator(("worker", "worker"))
    assert not sidecar.has_evaluator(None)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _placement(out: str) -> dict[str, object]:
    (line,) = [x for x in out.splitlines() if '"placement"' in x]
    event: dict[str, object] = json.loads(line)
    return event


@pytest.mark.parametrize(("rank", "role"), [(0, "worker"), (1, "worker"), (2, "evaluator")])
def test_evaluator_flag_in_a_three_task_step(
    fake_slurm_env: FakeSlurmEnv, capsys: pytest.CaptureFixture[str], rank: int, role: str
) -> None:
    from models import mnist

    fake_slurm_env.step("node[1-3]", "1(x3)", rank, SLURMD_NODENAME=f"node{rank + 1}", **STEP3)
    assert mnist.main(["--evaluator", "--placement_only"]) == 0
    event = _placement(capsys.readouterr().out)
    assert (event["rank"], event["role"]) == (rank, role)


@pytest.mark.parametrize(
    ("args", "jobs", "expected"),
    [
        (["--evaluator"], None, "--evaluator=True: needs a task to train and one to evaluate"),
        (["--evaluator"], "worker:3", "--evaluator=True: asks for an evaluator task, but "),
        ([], "chief:1,ps:1,worker:1", "SLURMTF_JOBS='chief:1,ps:1,worker:1': gives ps tasks"),
        ([], "worker:1,evaluator:2", "SLURMTF_JOBS='worker:1,evaluator:2': gives 'evaluator' 2"),
        (["--stop_threshold=0.5"], "worker:2,evaluator:1", "--stop_threshold=0.5: needs the "),
    ],
)
def test_bad_evaluator_shapes_stop_with_one_line(
    fake_slurm_env: FakeSlurmEnv,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    jobs: str | None,
    expected: str,
) -> None:
    from models import mnist

    if jobs is None:  # a one-task step
        fake_slurm_env.step("node1", "1", 0, SLURMD_NODENAME="node1", **STEP3)
    else:
        fake_slurm_env.step(
            "node[1-3]", "1(x3)", 0, SLURMD_NODENAME="node1", SLURMTF_JOBS=jobs, **STEP3
        )
    assert mnist.main([*args, "--placement_only"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"models.mnist: {expected}"), line
    assert "HINT: " in line


def test_benchmark_reads_the_chiefs_loop_rate() -> None:
    from benchmarks import bench_evaluator

    stderr = "16:21:54 rank0 I 30 steps in 44.7 s\n16:21:59 rank0 I Exported SavedModel"
    assert bench_evaluator.loop_rate(stderr) == (30, 44.7)
    with pytest.raises(ValueError, match="no 'N steps in S s' line"):
        bench_evaluator.loop_rate("nothing here")
    result = {
        "runs": [
            {"variant": "inloop", "steps": 120, "loop_s": 60.0, "steps_per_s": 2.0},
            {"variant": "sidecar", "steps": 120, "loop_s": 48.0, "steps_per_s": 2.5},
        ],
        "median_steps_per_s": {"inloop": 2.0, "sidecar": 2.5},
        "ratio": 1.25,
        "evaluations": 2,
        "steps": 120,
        "global_batch": 1000,
    }
    assert "ratio sidecar / in-loop **1.25**" in bench_evaluator.markdown(result)


class _Array:
    def __init__(self, values: list[float]) -> None:
        self.values = values

    def numpy(self) -> list[float]:
        return self.values


class _Restore:
    def expect_partial(self) -> None:
        return None


class _Checkpoint:
    def __init__(self, unreadable: set[str]) -> None:
        self.unreadable = unreadable
        self.restored: list[str] = []

    def restore(self, path: str) -> _Restore:
        if path in self.unreadable:
            raise OSError(f"{path}: not found")
        self.restored.append(path)
        return _Restore()


def _evaluator(
    monkeypatch: pytest.MonkeyPatch, listings: list[list[str]], unreadable: set[str] = frozenset()
) -> tuple[sidecar._Evaluator, _Checkpoint]:
    """An evaluator whose model, data and checkpoint directory are fakes (no TensorFlow):
    each look at the directory returns the next of ``listings`` (the last one stays)."""
    from types import SimpleNamespace

    looks = iter(listings)
    state = {"now": listings[0]}

    def listed(directory: object) -> list[str]:
        state["now"] = next(looks, state["now"])
        return state["now"]

    monkeypatch.setattr(sidecar, "listed_checkpoints", listed)
    checkpoint = _Checkpoint(set(unreadable))
    config = SimpleNamespace(model_dir="/m", registration_timeout=30.0, synthetic=True)
    info = SimpleNamespace(rank=2, restart_count=0, program="models.mnist")
    plan = SimpleNamespace(total=30, eval_steps=2, steps_per_epoch=10)
    evaluator = sidecar._Evaluator(
        None, config, info, plan, checkpoint=checkpoint, step_var=None,
        eval_step=lambda iterator: _Array([8.0, 12.0, 16.0]), iterator=None,
        summaries=SimpleNamespace(scalars=lambda split, step, values: None),
    )  # fmt: skip
    return evaluator, checkpoint


def _evals(out: str) -> list[dict[str, object]]:
    return [json.loads(x) for x in out.splitlines() if x.startswith('{"event": "eval"')]


def _done(out: str) -> dict[str, object]:
    (line,) = [x for x in out.splitlines() if x.startswith('{"event": "done"')]
    event: dict[str, object] = json.loads(line)
    return event


def _watch(answers: list[bool], clock: _Clock | None = None) -> ChiefWatch:
    found = iter(answers)
    return ChiefWatch(
        Chief("node1", 1), 30.0, probe=lambda h, p: next(found, False), clock=clock or _Clock()
    )


CKPT = "/m/checkpoints/ckpt-"
NOT_PREEMPTED = type("Watcher", (), {"requested": False})()


def test_evaluator_evaluates_each_checkpoint_in_order_and_ends_at_the_final_step(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    listings = [
        [],
        [f"{CKPT}10"],
        [f"{CKPT}20", f"{CKPT}10"],
        [f"{CKPT}10", f"{CKPT}20", f"{CKPT}30"],
    ]
    evaluator, checkpoint = _evaluator(monkeypatch, listings)
    sleeps: list[float] = []
    assert evaluator.run(NOT_PREEMPTED, sleeps.append, _watch([True] * 10)) == 0
    assert checkpoint.restored == [f"{CKPT}10", f"{CKPT}20", f"{CKPT}30"]
    out = capsys.readouterr().out
    events = _evals(out)
    assert [e["step"] for e in events] == [10, 20, 30]
    assert events[0]["loss"] == 0.5  # 2 batches: summed loss 16 over 32 examples
    assert events[0]["accuracy"] == 0.75
    assert events[0]["examples"] == 32
    assert _done(out)["step"] == 30
    assert len(sleeps) == 3  # one poll per look that found nothing final


def test_evaluator_ends_when_the_workers_end_before_the_final_step(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    evaluator, _ = _evaluator(monkeypatch, [[f"{CKPT}10"]])
    # the chief answers twice, then stops: its last checkpoint is evaluated once, then exit 0
    assert evaluator.run(NOT_PREEMPTED, lambda s: None, _watch([True, True])) == 0
    out = capsys.readouterr().out
    assert [e["step"] for e in _evals(out)] == [10]
    assert _done(out)["step"] == 10


def test_evaluator_gives_up_on_workers_that_never_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    evaluator, _ = _evaluator(monkeypatch, [[]])
    clock = _Clock()

    def sleep(seconds: float) -> None:
        clock.now += seconds

    assert evaluator.run(NOT_PREEMPTED, sleep, _watch([], clock)) == 1
    captured = capsys.readouterr()
    assert "did not answer within 30 s. HINT: " in captured.err
    assert _done(captured.out)["step"] is None


def test_evaluator_skips_a_checkpoint_it_cannot_read_three_times(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    listing = [f"{CKPT}10", f"{CKPT}20", f"{CKPT}30"]
    evaluator, checkpoint = _evaluator(monkeypatch, [listing], unreadable={f"{CKPT}20"})
    assert evaluator.run(NOT_PREEMPTED, lambda s: None, _watch([True] * 10)) == 0
    assert checkpoint.restored == [f"{CKPT}10", f"{CKPT}30"]
    assert [e["step"] for e in _evals(capsys.readouterr().out)] == [10, 30]


def test_evaluator_stops_on_the_preemption_signal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    evaluator, _ = _evaluator(monkeypatch, [[f"{CKPT}10"]])
    preempted = type("Watcher", (), {"requested": True})()
    assert evaluator.run(preempted, lambda s: None, _watch([True] * 10)) == 75
    assert _done(capsys.readouterr().out)["preempted"] is True
