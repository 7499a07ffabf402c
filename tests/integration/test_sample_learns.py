"""MNIST learns real handwritten digits: 2 workers reach a held-out accuracy far above
chance on the UCI digit sample (``slurmtf data sample-mnist``), equal to 1 worker's.

Both runs read the sample through ``--data_dir`` and the IDX reader (checksums
verified), train 6 epochs (138 steps of 60) and evaluate once on the 360 held-out
digits, whose writers' other digits are not all in the training split. Measured on
2 cores: 0.94 for both (chance: 0.10). The two runs see the same global batches in the
same order without dropout, so they differ only in the order of float32 sums: their
accuracies must agree within ``ACCURACY_TOLERANCE``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.datafiles import have_sklearn
from tests.helpers.localjobs import Job
from tests.prereqs import require

pytestmark = [pytest.mark.tf, pytest.mark.slow]
MIN_ACCURACY = 0.90  # held-out, 10 classes: chance is 0.10
ACCURACY_TOLERANCE = 0.02  # 7 of 360 digits
FLAGS = [
    "--batch_size=60",
    "--learning_rate=0.004",  # per 100 examples, scaled to 0.0024 for batch 60 (Adam)
    "--train_steps=138",  # 6 epochs of 1,437 digits
    "--epochs_between_evals=100",  # evaluate once, at the end
    "--dropout_rate=0",  # no per-replica random masks: 1 and 2 workers comparable
    "--seed=1",
    "--log_every=46",
]


@pytest.fixture
def jobs() -> Iterator[list[Job]]:
    made: list[Job] = []
    yield made
    for job in made:
        job.kill()


def test_two_workers_learn_real_digits_as_well_as_one(
    tmp_path: Path, jobs: list[Job], record_property: pytest.RecordProperty
) -> None:
    from slurmtf.datasets.sample import write_mnist_sample

    require(have_sklearn(), "scikit-learn (pip install 'slurmtf[data]')")
    data = tmp_path / "sample"
    write_mnist_sample(data)
    common = [f"--data_dir={data}", *FLAGS]
    two = Job(tmp_path, 2, "two").start("mnist", [*common, f"--model_dir={tmp_path / 'm2'}"])
    one = Job(tmp_path, 1, "one").start("mnist", [*common, f"--model_dir={tmp_path / 'm1'}"])
    jobs += [two, one]
    assert two.wait(300) == [0, 0], two.logs()
    assert one.wait(300) == [0], one.logs()

    evals = {n: job.events(0, "eval") for n, job in (("one", one), ("two", two))}
    assert [len(e) for e in evals.values()] == [1, 1], evals
    acc = {n: e[-1]["accuracy"] for n, e in evals.items()}
    record_property("held_out_accuracy", acc)
    print(f"held-out accuracy on the UCI digit sample: {acc}")
    for event in (evals["one"][-1], evals["two"][-1]):
        assert event["examples"] == 360  # the whole held-out split
        assert event["step"] == 138
    assert acc["two"] >= MIN_ACCURACY, two.logs()
    assert acc["one"] >= MIN_ACCURACY, one.logs()
    assert abs(acc["two"] - acc["one"]) <= ACCURACY_TOLERANCE, acc
    assert not two.events(0, "cluster")[0]["synthetic"]
    assert two.events(1, "cluster")[0]["num_workers"] == 2
    assert "SYNTHETIC" not in two.stderr(0)
