"""srun's exit status after a node failure, the same on every Slurm release.

Slurm 22.05's srun returned the status of the tasks that reported an ending (0 when only
the failed node's tasks were lost) and wrote ``Node failure on NODE``. From 23.02 it
exits 1 instead whenever its step suffers a node failure ("srun - return an error if step
suffers a node failure": ``src/api/step_launch.c`` sets the step's ``ret_code`` to 1 and
``src/srun/srun.c`` returns that in place of the tasks' status), with the same words.

:func:`tasks_status` gives back what the tasks say, as srun computes it from them
(``src/srun/launch.c`` ``_task_finish``: the highest signal wins, as 128+N; else the
highest exit code; a task out of memory is 1), so that :mod:`slurmtf.runtime.recovery`
decides the same on 22.05 and on 23.02 and later: a parameter-server job whose chief
completed after a worker's node failed is done on both.
"""

from __future__ import annotations

from collections.abc import Sequence

# srun's status after a node failure from Slurm 23.02 (slurmtf.slurm.release
# SRUN_FAILS_ON_NODE_FAILURE).
NODE_FAILURE_STATUS = 1


def tasks_status(
    status: int, endings: Sequence[tuple[int, bool]], failed_nodes: Sequence[str]
) -> int:
    """srun's ``status`` without the 1 that 23.02+ puts in place of the tasks' status after
    a node failure: when srun named failed nodes and exited 1 that no task's ending
    explains (``endings``: each reported task's status and whether a signal ended it, as
    ``(128+N, True)``), the status the tasks give (0 when none reported an ending); else
    ``status`` unchanged."""
    codes = [code for code, _ in endings]
    if not failed_nodes or status != NODE_FAILURE_STATUS or NODE_FAILURE_STATUS in codes:
        return status
    signals = [code for code, by_signal in endings if by_signal]
    return max(signals or codes or [0])
