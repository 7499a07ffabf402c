"""What follows an attempt of a step: how it ended, the nodes to go on with, the decision
and its record (pure but for ``evidence``, ``record`` and ``after_step``, which read and
write the job's files and ask Slurm through ``slurmtf.runtime.slurm_calls``):

- ``endings``: how one attempt ended (srun's ``task N: ...`` lines; its status after a node loss).
- ``evidence``: what one attempt left, read from its logs; the nodes lost while a step runs.
- ``node_choice``: which nodes the next step trains on, and which are left out for good.
- ``budget``: what ``MAX_RESTARTS`` counts (``RESTART_BUDGET``: failures without progress,
  or every restart) and whether a failure may restart (``count_budget``, ``Budget``).
- ``decision``: done, a restart in place, a requeue or a stop (``decide``, ``Budget``).
- ``record``: the job's recovery record (``recovery-<job>.jsonl``), read and appended to.
- ``after_step``: the edge: an attempt read, decided and recorded (``decide_and_record``).

May import: ``slurmtf.runtime.slurm_calls``, ``slurmtf.runtime.rank.held_port`` (a held
port's event), ``slurmtf.slurm`` and the vocabulary (``errors``, ``events``,
``contracts``).

``slurmtf.runtime.recovery`` was the module that is ``decision`` now: its names still
resolve here, with a DeprecationWarning.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_FORMER = frozenset({
    "NO_NODES", "Budget", "Decision", "decide", "after_check", "after_supervisor",
    "after_batch_host", "as_requeue", "classify", "tolerate_workers",
})  # fmt: skip


def __getattr__(name: str) -> Any:
    if name not in _FORMER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    new = f"{__name__}.decision"
    warnings.warn(f"{__name__}.{name} is now {new}.{name}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(new), name)
