"""Pure parts of slurmtf.training: flags, batch split, strategy plan, signals, formatting.

No TensorFlow needed: these run in the fast unit-test tier.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from slurmtf.contracts import format_seconds, parse_preemption_signal
from slurmtf.errors import InputError
from slurmtf.training.flags import TrainConfig, check_batch_size, scaled_learning_rate
from slurmtf.training.preemption import PreemptionWatcher
from slurmtf.training.strategy import StrategyChoice, plan_strategy


@pytest.mark.parametrize(
    ("batch", "replicas", "per_replica"), [(32, 1, 32), (32, 2, 16), (96, 8, 12), (7, 7, 1)]
)
def test_batch_splits_evenly(batch: int, replicas: int, per_replica: int) -> None:
    assert check_batch_size(batch, replicas) == per_replica


@pytest.mark.parametrize(
    ("batch", "replicas", "nearest"),
    [(33, 2, 32), (100, 8, 96), (3, 4, 4), (13, 4, 12), (14, 4, 12)],
)
def test_batch_error_names_nearest_valid_value(batch: int, replicas: int, nearest: int) -> None:
    with pytest.raises(InputError) as info:
        check_batch_size(batch, replicas)
    text = str(info.value)
    assert text.startswith(f"--batch_size={batch}: ")
    assert f"{replicas} replicas" in text
    assert f"HINT: use --batch_size={nearest} " in text


def test_linear_scaling_rule() -> None:
    assert scaled_learning_rate(0.1, 1024, 256) == pytest.approx(0.4)
    assert scaled_learning_rate(0.1, 128, 256) == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("mode", "alg", "workers", "gpus", "expected"),
    [
        ("auto", "auto", 1, 0, StrategyChoice("one_device", "/cpu:0", "ring")),
        ("auto", "auto", 1, 1, StrategyChoice("one_device", "/gpu:0", "nccl")),
        ("auto", "auto", 1, 4, StrategyChoice("mirrored", "", "nccl")),
        ("auto", "auto", 4, 0, StrategyChoice("multi_worker_mirrored", "", "ring")),
        ("auto", "auto", 4, 8, StrategyChoice("multi_worker_mirrored", "", "nccl")),
        ("auto", "ring", 2, 8, StrategyChoice("multi_worker_mirrored", "", "ring")),
        (
            "multi_worker_mirrored",
            "auto",
            1,
            0,
            StrategyChoice("multi_worker_mirrored", "", "ring"),
        ),
        ("off", "auto", 1, 2, StrategyChoice("off", "", "nccl")),
        ("mirrored", "auto", 1, 0, StrategyChoice("mirrored", "", "ring")),
    ],
)
def test_plan_strategy(
    mode: str, alg: str, workers: int, gpus: int, expected: StrategyChoice
) -> None:
    assert plan_strategy(mode, alg, workers, gpus) == expected


@pytest.mark.parametrize("mode", ["off", "one_device", "mirrored"])
def test_single_node_strategy_with_several_workers_is_an_error(mode: str) -> None:
    with pytest.raises(InputError, match=r"--distribution_strategy=.*3 workers.*HINT: "):
        plan_strategy(mode, "auto", 3, 0)


def test_nccl_without_gpus_is_an_error() -> None:
    with pytest.raises(
        InputError, match=r"--all_reduce_alg='nccl'.*HINT: use --all_reduce_alg=ring"
    ):
        plan_strategy("auto", "nccl", 2, 0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("USR2", signal.SIGUSR2),
        ("SIGUSR2", signal.SIGUSR2),
        ("term", signal.SIGTERM),
        ("12", signal.SIGUSR2),
    ],
)
def test_parse_signal(text: str, expected: signal.Signals) -> None:
    assert parse_preemption_signal(text) == expected


@pytest.mark.parametrize("text", ["USR3", "", "SIGFOO", "999"])
def test_parse_signal_rejects_unknown(text: str) -> None:
    with pytest.raises(InputError, match="--preemption_signal"):
        parse_preemption_signal(text)


@pytest.mark.parametrize(("text", "reason"), [("USR1", "NCCL reserves"), ("SIGUSR1", "NCCL")])
def test_one_signal_policy_for_submit_and_the_models(text: str, reason: str) -> None:
    """USR1 is refused by the models' --preemption_signal as by submit's --signal."""
    with pytest.raises(InputError, match=f"--preemption_signal='{text}'.*{reason}"):
        PreemptionWatcher(text)
    with pytest.raises(InputError, match=f"--signal='{text}'.*{reason}"):
        parse_preemption_signal(text, "--signal")


def test_uncatchable_signal_is_refused() -> None:
    with pytest.raises(InputError, match="cannot be caught"):
        PreemptionWatcher("KILL")


def test_watcher_flags_the_signal_and_restores_the_old_handler() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    watcher = PreemptionWatcher("USR2").install()
    try:
        assert not watcher.requested
        signal.raise_signal(signal.SIGUSR2)
        assert watcher.requested
    finally:
        watcher.uninstall()
    assert signal.getsignal(signal.SIGUSR2) == before


def test_sigterm_is_held_and_seen_by_a_thread_while_the_main_thread_waits() -> None:
    """A rank blocked in a collective learns of SIGTERM at once: a thread reads Python's
    wakeup fd and calls ``on_term`` (the loop aborts its collectives); the signal itself
    is held until the step ends, and everything is put back on uninstall."""
    called: list[str] = []
    seen = threading.Event()

    def on_term() -> None:
        called.append(threading.current_thread().name)
        seen.set()

    before = signal.getsignal(signal.SIGTERM)
    watcher = PreemptionWatcher("USR2", on_term=on_term).install()
    try:
        signal.raise_signal(signal.SIGTERM)  # held: the test process lives on
        assert seen.wait(5), "on_term was not called"
        assert watcher.terminating
        assert called == ["slurmtf-sigterm"]
    finally:
        watcher.uninstall()
    assert signal.getsignal(signal.SIGTERM) == before
    assert signal.set_wakeup_fd(-1) == -1  # no wakeup fd left behind
    assert not any(t.name == "slurmtf-sigterm" and t.is_alive() for t in _after(0.5))


def _after(seconds: float) -> list[threading.Thread]:
    time.sleep(seconds)
    return threading.enumerate()


def test_sigterm_as_the_preemption_signal_is_only_the_preemption() -> None:
    watcher = PreemptionWatcher("TERM", on_term=lambda: None).install()
    try:
        signal.raise_signal(signal.SIGTERM)
        assert watcher.requested
        assert not watcher.terminating
    finally:
        watcher.uninstall()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("batch_size", 0),
        ("train_steps", -1),
        ("learning_rate", 0.0),
        ("epochs_between_evals", 0),
        ("collective_timeout", -1.0),
        ("keep_checkpoints", 0),
        ("log_every", 0),
    ],
)
def test_config_rejects_bad_values(field: str, value: object) -> None:
    with pytest.raises(InputError, match=f"--{field}="):
        TrainConfig(**{field: value})  # type: ignore[arg-type]


def test_config_synthetic_when_no_data_dir() -> None:
    assert TrainConfig().synthetic
    assert not TrainConfig(data_dir="/data").synthetic
    assert TrainConfig(data_dir="/data", use_synthetic_data=True).synthetic


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0m00s"), (59.6, "1m00s"), (3725, "1h02m05s"), (-1, "?"), (float("inf"), "?")],
)
def test_format_seconds(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text


def test_model_main_is_callable_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    """``main(argv)`` without the program name: help exits 0, a bad flag exits 2 (no TF)."""
    from models import mnist, resnet

    assert mnist.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--batch_size" in out
    assert "--dropout_rate" in out  # the model's own flags too
    assert mnist.main(["--batch_sise=3"]) == 2
    assert "HINT: python -m models.mnist --help" in capsys.readouterr().err
    assert resnet.main(["--resnet_size=21"]) == 2
    assert "--resnet_size=21: is not a supported depth" in capsys.readouterr().err
    assert mnist.main(["--learning_rate=-1"]) == 2
    assert "--learning_rate=-1.0: must be positive" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("mode", "workers", "gpus"), [("auto", 2, 0), ("auto", 1, 1), ("one_device", 1, 0)]
)
def test_cpu_replicas_only_for_a_single_gpu_less_worker(mode: str, workers: int, gpus: int) -> None:
    from slurmtf.training.strategy import split_cpu

    with pytest.raises(InputError, match=r"--cpu_replicas=2: .*HINT: "):
        split_cpu(2, mode, workers, gpus)


@pytest.mark.parametrize(
    ("batch", "is_default", "replicas", "expected"),
    [
        (100, True, 8, 96),  # MNIST's default on 4 nodes x 2 tasks
        (100, True, 16, 96),
        (100, True, 3, 99),
        (100, True, 4, 100),  # already splits
        (128, True, 6, 126),
        (2, True, 4, 4),  # never below one example per replica
        (100, False, 8, 100),  # the user's choice is kept (and refused later, naming the fix)
    ],
)
def test_a_default_batch_fits_any_worker_count(
    batch: int, is_default: bool, replicas: int, expected: int
) -> None:
    from slurmtf.training.flags import fit_default_batch

    config = TrainConfig(batch_size=batch, batch_size_is_default=is_default)
    assert fit_default_batch(config, replicas).batch_size == expected
