"""A stand-in for a bug in the supervisor, for the tests only: with this folder first on
``PYTHONPATH`` and ``SLURMTF_TEST_CRASH_ONCE=FILE``, the first supervisor of a job dies of
an uncaught exception ``SLURMTF_TEST_CRASH_AFTER_S`` seconds into its run (a SIGALRM
whose handler raises), and FILE records that it did; later supervisors run as they are.
Other processes that import this module (ranks, the keeper) are left alone: only
``Supervisor.run``, which runs in the keeper's child, arms the alarm.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import signal
import sys
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

FLAG = os.environ.get("SLURMTF_TEST_CRASH_ONCE", "")
TARGET = "slurmtf.runtime.job.supervisor"


def _bug(_signum: int, _frame: FrameType | None) -> None:
    raise RuntimeError("a bug in the supervisor (the test's stand-in)")


def _arm(module: ModuleType) -> None:
    run = module.Supervisor.run

    def crash_once(self: Any, *args: Any, **kwargs: Any) -> int:
        flag = Path(FLAG)
        if not flag.exists():
            flag.write_text(str(os.getpid()))
            signal.signal(signal.SIGALRM, _bug)
            signal.alarm(int(os.environ.get("SLURMTF_TEST_CRASH_AFTER_S", "10")))
        result: int = run(self, *args, **kwargs)
        return result

    module.Supervisor.run = crash_once


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _arm(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if FLAG:
    sys.meta_path.insert(0, _Finder())
