"""Leave together: the end of a multi-worker process, in an order TensorFlow expects.

Measured on TensorFlow 2.21 (docs/FAILURES.md): a process that simply returns from its
training never tells the coordination service it is leaving (the service's agent is not
shut down at interpreter exit, so ``shutdown_barrier_timeout_in_ms`` is never reached).
When a worker leaves first, the leader (rank 0) declares it crashed once its heartbeats
stop (``E0000 ... StartAbort UNAVAILABLE ... The tasks have crashed``); when the leader
leaves first, the next heartbeat of every other rank fails (``Failed to send RPC to
coordination service``). Interpreter teardown of a TensorFlow process adds 1-3 s more.

:func:`leave_together` ends that: every rank waits at one coordination-service barrier
(after the chief's export, so nobody leaves while the leader is busy); then each worker
tells the leader it is going and leaves at once (``os._exit`` after running the
``atexit`` handlers and flushing), and the leader leaves last, once every worker has
said so. A rank whose peers never come (a peer died) logs one warning when the barrier
fails and returns: the failure is reported as before.

:func:`prepare` and :func:`leave_together` are safe in any process: without TensorFlow
imported, or without a multi-worker strategy, they do nothing. :func:`leave_alone` ends a
task outside the coordination service (the sidecar evaluator) the same fast way.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time
from typing import Any

from slurmtf.tf import coordination

BARRIER_ID = "slurmtf/leave_together"
LEFT_KEY = "slurmtf/left/"  # + the task's name: set by each worker just before it leaves
DEFAULT_TIMEOUT_S = 300.0  # the chief's export and the ranks' skew fall in this window
LEADER_WAIT_S = 10.0  # how long the leader waits for the workers' "left" keys

_state = {"left": False}


def prepare() -> None:
    """Call before the process creates its ``MultiWorkerMirroredStrategy``.

    Nothing needs configuring on TensorFlow 2.21: the service's shutdown barrier is
    never reached (see the module doc), and the final barrier needs no set-up. Kept as
    the one place a launcher calls first, so that a later TensorFlow needing
    configuration before the strategy exists changes this module only.
    """


def leave_together(
    strategy: Any = None, *, exit_code: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> bool:
    """Wait (at most ``timeout_s``) until every rank is here, then leave in order.

    With ``exit_code`` a multi-worker process ends here with that status (the fast,
    clean end: workers first, the leader last); without it, the call returns once all
    ranks have arrived and the caller exits as it likes. ``strategy`` is optional: the
    coordination service it started is found in TensorFlow's context. Returns whether
    the ranks met (False: not a multi-worker process, already called, or a peer never
    came). Idempotent.
    """
    del strategy  # the service lives in the eager context, not in the strategy object
    if _state["left"]:
        return False
    me = _coordinated_task()
    if me is None:
        return False
    _state["left"] = True
    from absl import logging  # here: TensorFlow has imported it; a launcher without TF need not

    task, leader, tasks = me
    ctx = _context()
    start = time.monotonic()
    try:
        ctx.wait_at_barrier(BARRIER_ID, int(timeout_s * 1000))
    except Exception as exc:  # any TF error: a peer is gone or late
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        logging.warning(
            "Not all ranks reached the end within %.0f s (%s); leaving alone", timeout_s, first
        )
        return False
    logging.info("All ranks finished (waited %.1f s for the others)", time.monotonic() - start)
    if exit_code is not None:
        _leave(ctx, task, leader, tasks, exit_code)
    return True


def leave_alone(exit_code: int) -> None:
    """End a task that is no part of the coordination service (the sidecar evaluator)
    at once: ``atexit`` handlers, flush, ``os._exit``, without the 1-3 s (more on a busy
    node) of a TensorFlow interpreter's teardown, which would delay the job's end."""
    _flush()
    os._exit(exit_code)


def _leave(ctx: Any, task: str, leader: str, tasks: list[str], exit_code: int) -> None:
    """Workers: flush, say so, exit. The leader: flush, wait for every worker, exit."""
    _flush()
    if task != leader:
        try:
            ctx.set_config_key_value(LEFT_KEY + task, "1")
        finally:
            os._exit(exit_code)
    deadline = time.monotonic() + LEADER_WAIT_S
    for other in tasks:
        if other == leader:
            continue
        remaining_ms = int(max(deadline - time.monotonic(), 0.001) * 1000)
        try:
            ctx.get_config_key_value(LEFT_KEY + other, remaining_ms)
        except Exception:  # a late worker: leave anyway
            continue
    os._exit(exit_code)


def _flush() -> None:
    """What a normal interpreter exit would do for us: atexit handlers, logs, stdio."""
    try:
        atexit._run_exitfuncs()  # logging.shutdown, TF's temp files, async checkpoints
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()


def _context() -> Any:
    from tensorflow.python.eager import context

    return context.context()


def _coordinated_task() -> tuple[str, str, list[str]] | None:
    """(this task, the leader, every coordinated task) as TF names them, or None when
    this process runs no multi-worker coordination service (or never imported TF)."""
    if "tensorflow" not in sys.modules:
        return None
    ctx = _context()
    config = ctx.coordination_service
    server_def = coordination.server_def(ctx)
    if config is None or server_def is None or getattr(ctx, "_context_handle", None) is None:
        return None
    tasks = [
        f"/job:{job.name}/replica:0/task:{i}"
        for job in config.coordinated_job_list
        for i in range(job.num_tasks)
    ]
    if len(tasks) < 2:
        return None
    task = f"/job:{server_def.job_name}/replica:0/task:{server_def.task_index}"
    leader = config.service_leader or tasks[0]
    return task, leader, tasks
