"""A warm rank: started before it is needed, it waits for its supervisor's word.

The job's supervisor (:mod:`slurmtf.runtime.job.warm`) starts the next attempt's ranks as
a step of their own (``srun --overlap``) while the current attempt trains. Each of them
gets ``SLURMTF_STANDBY=<go file>``: a bundled model imports TensorFlow and Keras, and the
per-task launcher of a ``slurmtf submit`` job waits before it starts its child; then they
wait for the go file. It holds one JSON object, written by one rename:

* ``{"go": true, "env": {...}}``: the attempt before has ended; the rank sets ``env`` in
  its environment (what the supervisor computes at each start) and starts as any rank.
* ``{"go": false}``: not needed (the next attempt runs elsewhere, or the job ends); the
  rank exits 0.

A rank also stops waiting when its supervisor is gone: the heartbeat file
(``SLURMTF_STANDBY_BEAT``, :mod:`slurmtf.runtime.batch_host.heartbeat`'s JSON) names
another ``pid`` than ``SLURMTF_STANDBY_OF``, or a state other than running; without a
heartbeat file (``--cluster=local``), when the process ``SLURMTF_STANDBY_OF`` is gone. While it
waits, its stderr (TensorFlow's start-up lines) goes to ``<go file>.<SLURM_PROCID>.err``,
removed at the go, so that the rank's own log holds only what the attempt wrote.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any

STANDBY_ENV = "SLURMTF_STANDBY"  # the go file this rank waits for
BEAT_ENV = "SLURMTF_STANDBY_BEAT"  # the supervisor's heartbeat file
OF_ENV = "SLURMTF_STANDBY_OF"  # the supervisor's pid
POLL_S = 0.02  # how often the go file is looked for
BEAT_EVERY_S = 1.0  # how often the heartbeat is read
LIVE_STATES = ("running", "restarting")


def go_file(environ: Mapping[str, str]) -> Path | None:
    """The go file this process waits for; ``None`` for a rank that starts at once."""
    value = environ.get(STANDBY_ENV, "")
    return Path(value) if value else None


def read_go(path: Path) -> dict[str, Any] | None:
    """The go file's word, or ``None`` while there is none (or it is not one)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) and isinstance(value.get("go"), bool) else None


def told_to_leave(path: Path) -> bool:
    """Whether the go file says go away (``{"go": false}``)."""
    word = read_go(path)
    return word is not None and not word["go"]


def waits(go: str | bytes | None) -> bool:
    """Whether a process started with ``SLURMTF_STANDBY=go`` still waits: a warm rank
    whose go file does not say go (``go`` as read from ``/proc/PID/environ``)."""
    if not go:
        return False
    word = read_go(Path(go.decode(errors="replace") if isinstance(go, bytes) else go))
    return not (word and word["go"])


def side_file(go: Path, rank: str) -> Path:
    """Where a waiting rank's stderr goes (:func:`quiet_stderr`)."""
    return go.with_name(f"{go.name}.{rank}.err")


def remove_files(go: Path, *, side_files: bool = True) -> None:
    """The go file and (``side_files``) every rank's :func:`side_file` of it."""
    sides = go.parent.glob(side_file(go, "*").name) if side_files else ()
    for path in [go, *sides]:
        with contextlib.suppress(OSError):
            path.unlink()


def write_go(path: Path, go: bool, env: Mapping[str, str] | None = None) -> None:
    """Write the word with one rename: a waiting rank never reads half of it."""
    hidden = path.with_name(f".{path.name}.{os.getpid()}")
    hidden.write_text(json.dumps({"go": go, "env": dict(env or {})}))
    hidden.replace(path)


def supervisor_gone(environ: Mapping[str, str]) -> str | None:
    """Why this rank's supervisor no longer waits for it, or ``None``."""
    beat, pid = environ.get(BEAT_ENV, ""), environ.get(OF_ENV, "")
    if not pid:
        return None
    if not beat:  # a runner on this machine (--cluster=local): its process
        return None if Path(f"/proc/{pid}").exists() else f"the runner (pid {pid}) is gone"
    try:
        value = json.loads(Path(beat).read_text())
    except (OSError, ValueError):
        return None  # not written yet, or half written: ask again
    if not isinstance(value, dict):
        return None
    if str(value.get("pid")) != pid:
        return f"another supervisor (pid {value.get('pid')}) runs the job"
    if value.get("state") not in LIVE_STATES:
        return f"the supervisor is {value.get('state')}"
    return None


def wait_for_go(
    environ: Mapping[str, str],
    poll_s: float = POLL_S,
    alive: Callable[[], bool] = lambda: True,
) -> dict[str, Any] | None:
    """Wait for the word; the ``env`` to set for a go, ``None`` for a stop (or once the
    supervisor is gone, or ``alive()`` is no longer true)."""
    path = go_file(environ)
    if path is None:
        return {}
    beat_at = 0.0
    while alive():
        word = read_go(path)
        if word is not None:
            return dict(word.get("env") or {}) if word["go"] else None
        now = time.monotonic()
        if now - beat_at >= BEAT_EVERY_S:
            beat_at = now
            if supervisor_gone(environ) is not None:
                return None
        time.sleep(poll_s)
    return None


def start_when_told(environ: MutableMapping[str, str]) -> bool:
    """Wait for the word when this rank is a warm one; True to start, False to exit.
    A go sets its ``env`` and removes ``SLURMTF_STANDBY`` (children start at once)."""
    if go_file(environ) is None:
        return True
    env = wait_for_go(environ)
    if env is None:
        return False
    environ.update(env)
    for name in (STANDBY_ENV, BEAT_ENV, OF_ENV):
        environ.pop(name, None)
    return True


@contextlib.contextmanager
def quiet_stderr(environ: Mapping[str, str]) -> Iterator[None]:
    """While a warm rank waits: fd 2 into its :func:`side_file`; back at the end, and the
    file removed (kept when the wait ends by an error: it says why)."""
    path = go_file(environ)
    if path is None:
        yield
        return
    side = side_file(path, environ.get("SLURM_PROCID", "0"))
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with side.open("ab") as handle:
            os.dup2(handle.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
    with contextlib.suppress(OSError):
        side.unlink()
