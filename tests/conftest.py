"""Shared fixtures: ``fake_slurm_env`` sets a fake Slurm task environment via monkeypatch."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

# submitit adds logging handlers on the streams of the moment of its first import: import
# it now, not inside a test whose captured streams are closed after it.
import submitit  # noqa: F401

from slurmtf.cluster.ports import free_port_base
from slurmtf.local.step import is_scrubbed
from tests.helpers.durations import longest_first, read_seconds
from tests.helpers.localjobs import Cluster, Job


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On pytest-xdist workers (``scripts/test.sh`` with ``SLURMTF_TEST_WORKERS``), the
    longest modules first by tests/module_seconds.json (:mod:`tests.helpers.durations`);
    every worker orders alike, so their collections stay equal. One process keeps
    pytest's order. Tests marked ``long`` run only when ``-m`` names them."""
    if "long" not in (config.option.markexpr or ""):
        long = [item for item in items if item.get_closest_marker("long")]
        if long:
            config.hook.pytest_deselected(items=long)
            items[:] = [item for item in items if not item.get_closest_marker("long")]
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    root = config.rootpath
    modules = list(dict.fromkeys(str(item.path.relative_to(root)) for item in items))
    rank = {module: i for i, module in enumerate(longest_first(modules, read_seconds()))}
    items.sort(key=lambda item: rank[str(item.path.relative_to(root))])


class FakeSlurmEnv:
    """A clean environment plus helpers that set what ``srun`` would set for one task.

    ``step(...)`` returns the variables it set, so the same dict can be handed to
    ``slurmtf.resolver.resolve(environ=...)`` for other ranks.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        self._monkeypatch = monkeypatch
        self._tmp_path = tmp_path
        for name in list(os.environ):
            if is_scrubbed(name):  # the host's own never leak in
                monkeypatch.delenv(name)

    def set(self, **variables: object) -> dict[str, str]:
        """Set variables (``None`` unsets); return the fake variables now set."""
        for name, value in variables.items():
            if value is None:
                self._monkeypatch.delenv(name, raising=False)
            else:
                self._monkeypatch.setenv(name, str(value))
        return self.current()

    def current(self) -> dict[str, str]:
        """The fake variables now in ``os.environ``."""
        return {k: v for k, v in os.environ.items() if is_scrubbed(k)}

    def hostfile(self, hosts: Sequence[str], name: str = "hostfile") -> str:
        """Write a ``SLURM_HOSTFILE`` (one host per line) and return its path."""
        path = self._tmp_path / name
        path.write_text("".join(f"{host}\n" for host in hosts))
        return str(path)

    @staticmethod
    def step_vars(
        nodelist: str = "node[1-2]",
        tasks_per_node: str = "1(x2)",
        procid: int | str = 0,
        *,
        ntasks: int | str | None = None,
        job_id: int | str | None = 1234,
        distribution: str | None = None,
        **extra: object,
    ) -> dict[str, str]:
        """The variables of task ``procid`` of an ``srun`` step, without setting them.

        ``ntasks`` defaults to the sum of ``tasks_per_node`` when that is plain digits
        and repeats; ``extra`` adds any other variable (``SLURMD_NODENAME="node1"``).
        """
        if ntasks is None:
            ntasks = _total(tasks_per_node)
        env = {
            "SLURM_STEP_NODELIST": nodelist,
            "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
            "SLURM_JOB_NODELIST": nodelist,
            "SLURM_TASKS_PER_NODE": tasks_per_node,
            "SLURM_PROCID": str(procid),
        }
        if ntasks is not None:
            env |= {"SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_NTASKS": str(ntasks)}
        if job_id is not None:
            env["SLURM_JOB_ID"] = str(job_id)
        if distribution is not None:
            env["SLURM_DISTRIBUTION"] = distribution
        env |= {name: str(value) for name, value in extra.items() if value is not None}
        return env

    def step(self, *args: object, **kwargs: object) -> dict[str, str]:
        """Set :meth:`step_vars` in ``os.environ``; return them."""
        variables = self.step_vars(*args, **kwargs)  # type: ignore[arg-type]
        self.set(**variables)
        return variables


def _total(tasks_per_node: str) -> int | None:
    total = 0
    for item in tasks_per_node.split(","):
        count, _, repeat = item.partition("(x")
        if not count.isdigit() or (repeat and not repeat.rstrip(")").isdigit()):
            return None
        total += int(count) * int(repeat.rstrip(")") or 1)
    return total


@pytest.fixture
def fake_slurm_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeSlurmEnv:
    """A clean environment (no SLURM_*, SLURMTF_*, CUDA_VISIBLE_DEVICES, TF_CONFIG)."""
    return FakeSlurmEnv(monkeypatch, tmp_path)


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[list[Job]]:
    made: list[Job] = []
    yield made
    for job in made:
        job.kill()


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[[int], Cluster]]:
    clusters: list[Cluster] = []

    def make(size: int) -> Cluster:
        root = tmp_path / f"c{len(clusters)}"
        root.mkdir()
        base = free_port_base(size)
        made = Cluster(root=root, size=size, port_base=base, job_id=4000 + len(clusters))
        clusters.append(made)
        return made

    yield make
    for made in clusters:
        made.cleanup()
    for made in clusters:
        print(made.logs())  # shown by pytest only when the test failed


RESTORED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


@pytest.fixture(autouse=True)
def _signals_restored() -> Iterator[None]:
    """Each test leaves this process's signal dispositions as it found them. A test that
    runs a supervisor or watcher in this process leaves SIGTERM ignored, and every child
    a later test starts would inherit that (an ignored signal survives exec)."""
    saved = {signum: signal.getsignal(signum) for signum in RESTORED_SIGNALS}
    yield
    for signum, handler in saved.items():
        if handler is not None and signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)
