"""What slurmtf's parts agree on: exit codes, log names, job states, the preemption signal,
which line of a rank's stderr says what went wrong.

One home for each value that more than one part (CLIs, the per-task launcher, the
training loop, the job scripts, ``slurmtf status``, benchmarks) must read the same way.
The job scripts are bash: they write ``75`` next to a comment naming
:data:`EXIT_PREEMPTED`. Event lines (the JSON on each rank's stdout) are
:mod:`slurmtf.events`.
"""

from __future__ import annotations

import math
import re
import signal
from pathlib import Path

from slurmtf.errors import InputError

EXIT_OK = 0
EXIT_FAILURE = 1  # anything slurmtf raises on purpose that is not bad input
EXIT_USAGE = 2  # bad input: a flag, an argument or a variable (as argparse exits)
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: checkpoint saved on the preemption signal; requeue me

# The line a hint gives for installing slurmtf on the nodes (after `PYTHON -m `).
INSTALL_LINE = 'pip install "slurmtf[gpu]" (or [cpu]; README, "Install on a cluster")'

DEFAULT_LOG_DIR = "slurmtf_logs"  # submit's per-job logs, relative to the submit directory
# How a rank's stdout/stderr files are named ({job}, {rank}, {kind}: out or err): by
# submitit (`slurmtf submit`) and by the job scripts (their supervisor, `rank%t.out`).
SUBMITIT_LOG_NAME = "{job}_{rank}_log.{kind}"
SCRIPT_LOG_NAME = "rank{rank}.{kind}"
# The file of each node's supervised events (slurmtf.events: ``%N`` is the node) beside
# the rank logs: what a job's supervisor reads while a step runs.
NODE_EVENTS_NAME = "events-{job}-%N.jsonl"

# Slurm's final job states and the status `submit --wait` / `slurmtf status` exit with.
FINAL_STATES: dict[str, int] = {
    "COMPLETED": EXIT_OK,
    "FAILED": EXIT_FAILURE,
    "CANCELLED": 130,
    "TIMEOUT": 124,
    "NODE_FAIL": EXIT_FAILURE,
    "PREEMPTED": EXIT_FAILURE,
    "OUT_OF_MEMORY": 137,
    "BOOT_FAIL": EXIT_FAILURE,
    "DEADLINE": 124,
    "SPECIAL_EXIT": EXIT_FAILURE,  # requeued and held after an exit the site marks special
}

DEFAULT_PREEMPTION_SIGNAL = "USR2"
_REFUSED_SIGNALS = {
    "USR1": "NCCL reserves SIGUSR1; use USR2 (the default)",
    "KILL": "SIGKILL cannot be caught; use USR2",
    "STOP": "SIGSTOP cannot be caught; use USR2",
}


def base_state(state: str) -> str:
    """``CANCELLED by 0`` / ``COMPLETED+`` -> ``CANCELLED`` / ``COMPLETED``."""
    words = state.split(maxsplit=1)
    return words[0].rstrip("+") if words else ""


def is_final(state: str) -> bool:
    """True for a state Slurm never leaves (``COMPLETED``, ``FAILED``, ...)."""
    return base_state(state) in FINAL_STATES


def parse_preemption_signal(value: str, name: str = "--preemption_signal") -> signal.Signals:
    """``USR2``/``SIGUSR2``/``12`` -> ``signal.SIGUSR2``; refuses USR1 (NCCL), KILL and STOP."""
    text = value.strip().upper()
    try:
        sig = (
            signal.Signals(int(text))
            if text.isdigit()
            else signal.Signals["SIG" + text.removeprefix("SIG")]
        )
    except (KeyError, ValueError) as exc:
        raise InputError(name, value, "is not a signal", "e.g. USR2 (default), TERM") from exc
    short = sig.name.removeprefix("SIG")
    if short in _REFUSED_SIGNALS:
        raise InputError(name, value, "cannot be the preemption signal", _REFUSED_SIGNALS[short])
    return sig


# Slurm's warning before the time limit (--signal=USR2@S, without B:) and a site's
# preemption notice reach every task of every step of the job.
WARNING_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


def ignore_warning_signals() -> None:
    """For slurmtf's own steps (staging, the watcher, a parameter-server server): the
    ranks save on the warning, and these must outlive it rather than die of its default
    action (the job's staged copies left on the nodes, the batch host unwatched)."""
    for sig in WARNING_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def ending_signal(status: int) -> signal.Signals | None:
    """The signal that ended a process, from its status as Python (``-N``) or a shell or
    launcher (``128+N``) reports it; ``None`` for a process that exited by itself."""
    number = -status if status < 0 else status - 128 if 128 < status <= 192 else 0
    try:
        return signal.Signals(number) if number else None
    except ValueError:
        return None


def shell_status(status: int) -> int:
    """A child's status as a shell reports it: ``128+N`` for a child ended by signal N."""
    return 128 - status if status < 0 else status


def signal_name(sig: signal.Signals) -> str:
    """``signal.SIGUSR2`` -> ``USR2`` (as ``sbatch --signal`` writes it)."""
    return sig.name.removeprefix("SIG")


def rank_log_paths(folder: Path, job_id: str, num_tasks: int, suffix: str = "out") -> list[Path]:
    """Per-rank logs as submitit names them: ``<folder>/<job>_<rank>_log.<suffix>``."""
    name = SUBMITIT_LOG_NAME
    return [folder / name.format(job=job_id, rank=rank, kind=suffix) for rank in range(num_tasks)]


# How a duration reads, in the chief's progress lines and in slurmtf status alike.
def format_seconds(seconds: float) -> str:
    """``3725`` -> ``1h02m05s``."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s"


# A rank's own words first: a Python exception line or a slurmtf one-line error
# (`NAME='value': problem. HINT: fix`); then Slurm's and a program's error lines.
_OWN_ERROR = re.compile(
    r"^([A-Za-z_]\w*\.)*[A-Za-z_]\w*(Error|Exception|Exit|Interrupt)(:.*)?$|HINT: "
)
_OTHER_ERROR = re.compile(r"^srun: error|^slurmstepd\S*: error|Killed|^\w+: error")
# Never what went wrong: TensorFlow's and absl's info and warning lines.
_CHATTER = re.compile(r"^[IW]\d{4} |^[0-9-]+ [0-9:.]+: [IW] |^WARNING:")


def is_error_line(line: str) -> bool:
    """Whether a line of a rank's stderr reads as an error (see :func:`rank_error_line`)."""
    text = line.strip()
    return bool(_OWN_ERROR.search(text) or _OTHER_ERROR.search(text))


def rank_error_line(text: str, failed: bool = False) -> str:
    """The line of a rank's stderr that says what went wrong: its last exception line or
    slurmtf one-line error, else the last error line of srun, slurmstepd or a program;
    ``""`` without one. For a rank known to have ``failed``, its last line that is not
    TensorFlow's info or warning chatter (else its last line) stands in.

    The one definition: ``slurmtf status``, the sweep table, the console's filter and the
    job's end (the supervisor, through :mod:`slurmtf.runtime.recovery.evidence`) all read a rank's
    stderr with it.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for pattern in (_OWN_ERROR, _OTHER_ERROR):
        found = [line for line in lines if pattern.search(line)]
        if found:
            return found[-1]
    if not failed:
        return ""
    plain = [line for line in lines if not _CHATTER.search(line)]
    return (plain or lines or [""])[-1]
