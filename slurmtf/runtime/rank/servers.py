"""The ps and worker tasks of a ParameterServerStrategy job: a TensorFlow server each,
stopped when the chief's script ends.

TensorFlow's parameter-server tutorial starts ``tf.distribute.Server`` on every ps and
worker task and ``join()``s forever: nothing stops the servers, so the job runs to its
time limit after the coordinator (the chief) is done. Here each server watches the
chief's port instead (:func:`watch_chief`, through :mod:`slurmtf.runtime.rank.chief_watch`): it
waits, for a bounded time, for the chief's own server to come up
(ParameterServerStrategy starts it on the chief's address), then ends as soon as that
port stops answering, however the chief's script ended. A done file ends it too.
Everything comes from the layout (roles, addresses, ports); TensorFlow is imported only
in :func:`start_server`.

Front end: ``slurmtf serve`` / ``python -m slurmtf.serve`` (:mod:`slurmtf.cli.serve`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurmtf.cluster.gpu_plan import apply_gpu_split
from slurmtf.cluster.layout import ClusterLayout
from slurmtf.errors import InputError
from slurmtf.runtime.rank.chief_watch import POLL_S, START_TIMEOUT_S, Chief, ChiefWatch, answers
from slurmtf.runtime.rank.held_port import check_port, recheck_port

SERVER_ROLES = ("ps", "worker")
_JOBS_HINT = "set SLURMTF_JOBS (or --jobs), e.g. chief:1,ps:2,worker, on every task of the step"


def chief_of(layout: ClusterLayout) -> Chief:
    """The chief of ``layout`` (ParameterServerStrategy's coordinator)."""
    if layout.roles is None or "chief" not in layout.roles:
        value = None if layout.roles is None else ",".join(layout.cluster())
        raise InputError(
            "SLURMTF_JOBS",
            value,
            "gives the step no chief, whose end would stop the servers",
            _JOBS_HINT,
        )
    return Chief.at(layout.cluster()["chief"][0])


def watch_chief(
    chief: Chief,
    *,
    start_timeout: float = START_TIMEOUT_S,
    poll: float = POLL_S,
    done_file: Path | None = None,
    probe: Callable[[str, int], bool] = answers,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Block until the chief's script has ended; return why (one line).

    Raises :class:`~slurmtf.runtime.rank.chief_watch.ChiefNeverStarted` when the chief's port never
    answered within ``start_timeout`` seconds. One probe per ``poll`` seconds
    (:class:`~slurmtf.runtime.rank.chief_watch.ChiefWatch`): bounded, no threads.
    """
    watch = ChiefWatch(chief, start_timeout, probe=probe, clock=clock)
    while True:
        if done_file is not None and done_file.exists():
            return f"the done file {done_file} exists"
        if watch.gone():
            return f"the chief's server at {chief} stopped answering: its script ended"
        sleep(poll)


def check_server_task(layout: ClusterLayout) -> None:
    """Raise unless this task is a ps or a worker of a job with roles."""
    if layout.roles is None:
        raise InputError("SLURMTF_JOBS", None, "is not set, so every task is a worker", _JOBS_HINT)
    if layout.task_type not in SERVER_ROLES:
        raise InputError(
            "SLURMTF_JOBS",
            ",".join(f"{k}:{len(v)}" for k, v in layout.cluster().items()),
            f"makes this task (rank {layout.task_index}) the {layout.task_type}, which runs "
            "the training script, not a server",
            "give the command after --: slurmtf serve -- python SCRIPT runs it on the chief",
        )


def start_server(layout: ClusterLayout) -> Any:
    """Start this task's ``tf.distribute.Server`` (its GPUs chosen first); return it."""
    check_server_task(layout)
    apply_gpu_split(layout)  # a ps hides the GPUs before TensorFlow reads them
    check_port(layout)
    from slurmtf.tf import install
    from slurmtf.tf.lean_import import import_tensorflow_lean

    install.check_release()

    tf = import_tensorflow_lean()  # a server builds no Keras model
    # only now: tf_resolver imports TensorFlow itself, which would bring Keras in
    from slurmtf.tf.cluster_resolver import SlurmtfClusterResolver

    resolver = SlurmtfClusterResolver(layout)
    try:
        return tf.distribute.Server(
            resolver.cluster_spec(),
            job_name=layout.task_type,
            task_index=layout.task_id,
            protocol=resolver.rpc_layer,
            start=True,
        )
    except Exception:
        recheck_port(layout)  # taken while TensorFlow loaded: the node's, not ours
        raise
