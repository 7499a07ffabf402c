"""Pictures of a job: ``slurmtf plot JOB`` (matplotlib, the optional extra ``plot``).

:func:`runs_of` finds the job's runs: one for a job, one per array task for a sweep
(each labelled with its parameters from the ``launch`` event). :func:`series_of` reads a
run's event lines (:mod:`slurmtf.events`) into the curves: training loss and accuracy
(the chief's ``progress``), evaluation loss and accuracy (``eval``), examples/s for every
rank that reports progress, and the steps where the run restarted or was preempted.
:func:`render` draws them; it works on a running job too (what is logged so far).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from slurmtf.errors import SlurmtfError
from slurmtf.events import Event, named, read_events
from slurmtf.monitor.records import JobPlace

MAX_SWEEP_POINTS = 1000  # array tasks looked for when the job id has no logs of its own


@dataclasses.dataclass
class Series:
    """The curves of one run (one job, or one point of a sweep)."""

    label: str
    train_loss: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    train_accuracy: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    eval_loss: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    eval_accuracy: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    rate: dict[int, list[tuple[float, float]]] = dataclasses.field(default_factory=dict)
    restarts: list[float] = dataclasses.field(default_factory=list)
    preemptions: list[float] = dataclasses.field(default_factory=list)


def runs_of(place: JobPlace) -> list[tuple[JobPlace, str]]:
    """The job itself, or the array tasks ``JOB_0``, ``JOB_1``, ... of a sweep."""
    if place.ranks():
        return [(place, "")]
    runs = []
    for index in range(MAX_SWEEP_POINTS):
        task = dataclasses.replace(place, job_id=f"{place.job_id}_{index}")
        if not task.ranks():
            break
        runs.append((task, _params(read_events(task.rank_log(0)))))
    return runs


def _params(events: list[Event]) -> str:
    launches = named(events, "launch")
    params = launches[-1].get("params") if launches else None
    if not isinstance(params, dict) or not params:
        return ""
    return " ".join(f"{k}={v}" for k, v in params.items())


def _point(event: Event, key: str) -> tuple[float, float] | None:
    step, value = event.get("step"), event.get(key)
    if isinstance(step, int | float) and isinstance(value, int | float):
        return float(step), float(value)
    return None


def series_of(place: JobPlace, label: str = "") -> Series:
    """A run's curves from its ranks' event lines."""
    series = Series(label or place.job_id)
    for rank in place.ranks():
        events = read_events(place.rank_log(rank))
        rates = [p for e in named(events, "progress") if (p := _point(e, "examples_per_sec"))]
        if rates:
            series.rate[rank] = rates
        if rank == 0:
            _chief(series, events)
    return series


def _chief(series: Series, events: list[Event]) -> None:
    """Loss, accuracy, restarts (a later ``cluster`` event) and preemptions (``done``)."""
    step = 0.0
    starts = 0
    for event in events:
        name = event.get("event")
        point = _point(event, "loss")
        if name == "progress" and point:
            series.train_loss.append(point)
            step = point[0]
            if acc := _point(event, "accuracy"):
                series.train_accuracy.append(acc)
        elif name == "eval" and point:
            series.eval_loss.append(point)
            if acc := _point(event, "accuracy"):
                series.eval_accuracy.append(acc)
        elif name == "cluster":
            starts += 1
            if starts > 1:
                series.restarts.append(step)
        elif name == "done" and event.get("preempted") and isinstance(event.get("step"), int):
            series.preemptions.append(float(event["step"]))


def render(runs: list[Series], out: Path, title: str) -> Path:
    """Loss, accuracy and examples/s against step, one curve per run; the PNG written."""
    try:
        import matplotlib
    except ImportError as exc:
        raise SlurmtfError(
            "matplotlib is not installed. HINT: pip install 'slurmtf[plot]'"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(7.5, 8.5), sharex=True)
    for index, run in enumerate(runs):
        color = f"C{index % 10}"
        name = run.label if len(runs) > 1 else ""
        _curves(axes[0], run.train_loss, run.eval_loss, color, name)
        _curves(axes[1], run.train_accuracy, run.eval_accuracy, color, name)
        for rank, rates in sorted(run.rate.items()):
            label = f"{name} rank {rank}".strip()
            axes[2].plot(*zip(*rates, strict=True), color=color, marker=".",
                         alpha=1.0 if rank == 0 else 0.5, label=label)  # fmt: skip
        for ax in axes:
            for step in run.restarts:
                ax.axvline(step, color=color, linestyle=":", linewidth=1)
            for step in run.preemptions:
                ax.axvline(step, color=color, linestyle="--", linewidth=1)
    axes[0].set_ylabel("loss")
    axes[1].set_ylabel("accuracy")
    axes[2].set_ylabel("examples/s")
    axes[2].set_xlabel("step (dotted: restart, dashed: preemption)")
    axes[0].set_title(title)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _curves(ax: Any, train: list[Any], evals: list[Any], color: str, name: str) -> None:
    if train:
        ax.plot(*zip(*train, strict=True), color=color, marker=".", label=f"{name} train".strip())
    if evals:
        ax.plot(*zip(*evals, strict=True), color=color, marker="o", linestyle="--",
                label=f"{name} eval".strip())  # fmt: skip
