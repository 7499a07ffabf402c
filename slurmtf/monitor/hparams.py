"""A sweep in TensorBoard's HParams dashboard, written from its results table.

:func:`write_sweep` turns a sweep's rows (:mod:`slurmtf.monitor.sweep_rows`) into the
HParams plugin's data in ``<log folder>/<job>_hparams``: the experiment (every
parameter with the values the points took, and the metrics) in the folder itself, and
one session per point in ``<task>/`` (its parameters, its state, its final eval loss,
accuracy and examples/s as scalars). Written with TensorBoard's own record writer and
protos, no TensorFlow. Idempotent: the folder is rewritten only when the table changed
(``sweep.json`` keeps what it holds), and replaced whole, never appended to.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurmtf.monitor.sweep_rows import SweepRow, param_names

MANIFEST = "sweep.json"
# Metric tag -> the row's attribute and how it reads in the HParams table.
METRICS = {
    "loss": "final loss (eval, else train)",
    "accuracy": "final accuracy (eval, else train)",
    "examples_per_sec": "examples/s (last)",
}


def folder_of(log_dir: Path, job_id: str) -> Path:
    """Where array ``job_id``'s HParams data goes: beside its logs."""
    return log_dir / f"{job_id}_hparams"


def value_of(text: str) -> float | str:
    """A parameter as the HParams table sorts it: a number when it reads as one."""
    try:
        return float(text)
    except ValueError:
        return text


def content(job_id: str, rows: Sequence[SweepRow]) -> dict[str, Any]:
    """What the folder holds, as a value (the manifest compared before rewriting)."""
    points = [
        {
            "task": row.task,
            "params": row.params,
            "state": row.state,
            "final": row.final,
            "step": row.step,
            "metrics": {k: getattr(row, k) for k in METRICS if getattr(row, k) is not None},
        }
        for row in rows
    ]
    return {"job_id": job_id, "params": param_names(rows), "points": points}


def write_rows(job_id: str, rows: Sequence[SweepRow]) -> Path | None:
    """The sweep's HParams folder beside its first point's logs, written unless
    unchanged; None when there is none (no rows, no TensorBoard, a read-only folder)."""
    if not rows:
        return None
    folder = folder_of(Path(rows[0].logs).parent, job_id)
    try:
        write_sweep(job_id, rows, folder)
    except OSError:
        return None
    return folder if (folder / MANIFEST).exists() else None


def write_sweep(job_id: str, rows: Sequence[SweepRow], folder: Path) -> bool:
    """Write the HParams data of ``rows`` into ``folder``; False when it was already
    there (same table) or when TensorBoard is not installed."""
    data = content(job_id, rows)
    try:
        if json.loads((folder / MANIFEST).read_text()) == data:
            return False
    except (OSError, ValueError):
        pass
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    staging = folder.with_name(f".{folder.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    _write_experiment(staging, data)
    for point in data["points"]:
        _write_session(staging / point["task"], point)
    (staging / MANIFEST).write_text(json.dumps(data, indent=1) + "\n")
    old = folder.with_name(f".{folder.name}.old.{os.getpid()}")
    if folder.exists():
        folder.rename(old)
    staging.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    return True


def write_events(folder: Path, summaries: Sequence[tuple[Any, int]]) -> None:
    """One event file of ``(summary, step)`` in ``folder``: TensorBoard's record framing
    over a plain file (its ``EventFileWriter`` opens files through TensorFlow's, when
    TensorFlow is installed, and starts a thread)."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    folder.mkdir(parents=True, exist_ok=True)
    now = time.time()
    name = f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.slurmtf"
    with (folder / name).open("wb") as file:
        records = RecordWriter(file)
        records.write(
            event_pb2.Event(wall_time=now, file_version="brain.Event:2").SerializeToString()
        )
        for summary, step in summaries:
            event = event_pb2.Event(wall_time=now, step=step, summary=summary)
            records.write(event.SerializeToString())


def _write_experiment(folder: Path, data: dict[str, Any]) -> None:
    from tensorboard.plugins.hparams import summary_v2 as hp

    values: dict[str, list[float | str]] = {name: [] for name in data["params"]}
    for point in data["points"]:
        for name, text in point["params"].items():
            if value_of(text) not in values[name]:
                values[name].append(value_of(text))
    hparams = [
        hp.HParam(name, hp.Discrete(found) if _one_type(found) else None)
        for name, found in values.items()
    ]
    metrics = [hp.Metric(tag, display_name=text) for tag, text in METRICS.items()]
    write_events(folder, [(hp.hparams_config_pb(hparams, metrics), 0)])


def _one_type(values: Sequence[float | str]) -> bool:
    return bool(values) and len({type(v) for v in values}) == 1


def _write_session(folder: Path, point: dict[str, Any]) -> None:
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
    from tensorboard.plugins.hparams import summary_v2 as hp
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb

    params = {name: value_of(text) for name, text in point["params"].items()}
    step = int(point["step"] or 0)
    summaries = [(hp.hparams_pb(params, trial_id=point["task"], start_time_secs=0.0), 0)]
    summaries += [(scalar_pb(tag, value), step) for tag, value in point["metrics"].items()]
    if point["final"]:
        ok = point["state"].startswith("COMPLETED")
        status = api_pb2.STATUS_SUCCESS if ok else api_pb2.STATUS_FAILURE
        ended = plugin_data_pb2.SessionEndInfo(status=status, end_time_secs=0.0)
        summaries.append(
            (_plugin_pb(plugin_data_pb2.HParamsPluginData(session_end_info=ended)), step)
        )
    write_events(folder, summaries)


def _plugin_pb(data: Any) -> Any:
    """A session's end as a summary (the plugin's own helper for it imports TensorFlow)."""
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.plugins.hparams import metadata

    summary = summary_pb2.Summary()
    summary.value.add(
        tag=metadata.SESSION_END_INFO_TAG,
        metadata=metadata.create_summary_metadata(data),
        tensor=metadata.NULL_TENSOR,
    )
    return summary
