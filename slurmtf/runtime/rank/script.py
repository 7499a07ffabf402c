"""Run an unmodified training script on a task, as ``python SCRIPT`` would.

The per-task launcher for scripts written from TensorFlow's own tutorials (they read
``TF_CONFIG``, build ``tf.distribute.MultiWorkerMirroredStrategy()`` without arguments
and call Keras ``model.fit``), as ``torchrun`` is for PyTorch. Before the script's first
line, in the script's own interpreter:

1. this task's place in the job is resolved (as :func:`slurmtf.resolver.resolve` does); a single
   worker (outside Slurm, or a one-task step) gets a free port, unless
   ``SLURMTF_PORT_BASE`` names one;
2. its GPUs are narrowed (:func:`slurmtf.cluster.gpu_plan.apply_gpu_split`) and ``TF_CONFIG`` is
   exported (:func:`slurmtf.resolver.export_tf_config`);
3. glibc's malloc arenas are capped as for the bundled models
   (:func:`slurmtf.runtime.rank.allocator.limit_arenas`; ``MALLOC_ARENA_MAX`` wins), and
   import hooks are set, so that the moment TensorFlow has been imported the collective
   keys are made reusable (:func:`slurmtf.tf.collectives.reuse_collective_instance_keys`:
   flat memory over long runs), and the moment Keras 3 has been imported its
   ``model.fit`` fixes are applied (:func:`slurmtf.tf.keras_compat.enable_multiworker_fit`;
   not with ``TF_USE_LEGACY_KERAS=1``, where ``tf.keras`` is ``tf_keras``). Nothing is
   imported early: a script that sets TensorFlow's variables before importing it keeps
   them, and a script that never imports TensorFlow never loads it.

With ``--cluster_flags`` (``Target.cluster_flags``) the script's arguments end with this
task's ``--worker_hosts=H1:P1,... --task_index=N``, as TensorFlow's official models take
the cluster (:func:`slurmtf.cluster.flags.cluster_flags`).

When the job staged its data set (``STAGE_DATA=1``), ``--data_dir=SRC`` (or
``--data_dir SRC``) among the script's arguments, and ``DATA_DIR=SRC``, name this node's
verified copy instead (:func:`slurmtf.datasets.stage.staged_args`).

Then the script runs in this process as ``__main__`` with ``sys.argv`` = ``[SCRIPT,
*ARGS]`` and its folder first on ``sys.path``: its signals, exit status and exceptions
are its own (a traceback ends it with status 1, printed without the launcher's frames).
Applying the fixes is idempotent, so a script that calls
:func:`slurmtf.resolver.cluster_resolver` itself gets them once. A multi-worker script
that ends with 0 (or 75, preempted) leaves with its peers
(:func:`slurmtf.runtime.rank.teardown.leave_together`): no rank is reported as crashed, and the job
ends within a second or two of the last rank's last line.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

import slurmtf
from slurmtf.cluster.env import read_slurm_env
from slurmtf.cluster.flags import cluster_flags
from slurmtf.cluster.gpu_plan import apply_gpu_split
from slurmtf.cluster.layout import ClusterLayout, build_layout
from slurmtf.cluster.ports import free_port_base
from slurmtf.contracts import EXIT_OK, EXIT_PREEMPTED
from slurmtf.datasets.stage import resolve_data_dir, staged_args
from slurmtf.events import emit
from slurmtf.monitor.tracker_runs import export_tracker_env
from slurmtf.resolver import export_tf_config
from slurmtf.runtime.rank import allocator, teardown
from slurmtf.runtime.rank.held_port import check_port
from slurmtf.tf import install


@dataclasses.dataclass(frozen=True)
class Target:
    """What to run: a script path, or a module (``-m``), with its arguments."""

    path: str
    args: tuple[str, ...] = ()
    module: bool = False
    cluster_flags: bool = False  # append --worker_hosts, --task_index (resolved) to args

    @property
    def argv(self) -> list[str]:
        """``sys.argv``; for a module, ``runpy.run_module`` replaces ``argv[0]`` with the
        module's file when it finds it, as ``python -m MODULE`` does."""
        return [self.path, *self.args]

    @property
    def command(self) -> list[str]:
        """The command line this stands for: ``[SCRIPT, ARGS...]`` or ``[-m, MODULE, ...]``."""
        return ["-m", *self.argv] if self.module else self.argv


def prepare_task(environ: MutableMapping[str, str] = os.environ) -> ClusterLayout:
    """Resolve this task, check its port, narrow its GPUs and export ``TF_CONFIG`` (steps
    1-2 above)."""
    env = read_slurm_env(environ)
    layout = build_layout(env)
    if layout.is_single_worker and env.port_base is None:
        # A single worker still starts TensorFlow's gRPC server when TF_CONFIG names a
        # cluster; one fixed port would collide with the next single worker on this
        # machine (or node), so it takes a free one, at random.
        layout = build_layout(env, port_base=free_port_base(1))
    check_port(layout)  # before the script's TensorFlow binds it
    apply_gpu_split(layout, environ)
    export_tf_config(layout, environ)
    export_tracker_env(environ, chief=layout.is_chief, rank=layout.task_index)
    return layout


class _ImportWatch(importlib.abc.MetaPathFinder):
    """Calls ``ready()`` whenever the outermost import of a watched top-level module ends.

    TensorFlow imports parts of Keras while it loads, and Keras imports TensorFlow: a fix
    for either is safe only once neither is half-imported, so the watch counts nested
    imports of the watched names and calls ``ready`` when the count is back to zero.
    """

    def __init__(self, names: Sequence[str], ready: Callable[[], None]) -> None:
        self.names = set(names)
        self.ready = ready
        self.depth = 0

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        self.names.discard(fullname)  # each name once; and so the search below skips us
        if not self.names:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, self)
        return spec


class _Loader(importlib.abc.Loader):
    """A module's own loader, counted by its watch; everything else is the original's."""

    def __init__(self, original: Any, watch: _ImportWatch) -> None:
        self._original = original
        self._watch = watch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        result: ModuleType | None = self._original.create_module(spec)
        return result

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._original
        if module.__spec__ is not None:
            module.__spec__.loader = self._original
        self._watch.depth += 1
        try:
            self._original.exec_module(module)
        finally:
            self._watch.depth -= 1
        if self._watch.depth == 0:
            self._watch.ready()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)


def apply_fixes() -> None:
    """The collective keys if TensorFlow is imported, the Keras 3 ``fit`` fixes if Keras
    is (not under ``TF_USE_LEGACY_KERAS=1``), an allocation board for every ``fit`` of the
    Keras imported (``SLURMTF_FIT_BOARD=0``: none). Idempotent."""
    if "tensorflow" in sys.modules:
        from slurmtf.tf.collectives import reuse_collective_instance_keys

        reuse_collective_instance_keys()
    if "keras" in sys.modules:
        from slurmtf.tf import keras_compat

        if not keras_compat.legacy_keras_selected():
            keras_compat.enable_multiworker_fit()
    from slurmtf import fit

    if os.environ.get(fit.FIT_BOARD_ENV, "1").strip() != "0":
        for name in ("keras", "tf_keras"):  # tf_keras: tf.keras under TF_USE_LEGACY_KERAS=1
            if name in sys.modules:
                fit.add_board_to_fit(sys.modules[name])


def install_fixes() -> None:
    """Step 3: :func:`apply_fixes` as soon as TensorFlow or Keras has been imported (now,
    if one already is), and again when the other is."""
    watched = [name for name in ("tensorflow", "keras", "tf_keras") if name not in sys.modules]
    if len(watched) < 3:
        apply_fixes()
    if watched:
        sys.meta_path.insert(0, _ImportWatch(watched, apply_fixes))


def run_target(target: Target) -> int:
    """Run ``target`` as ``__main__`` in this process; its exit status.

    ``SystemExit`` keeps Python's meaning (``None``: 0, an int: itself, anything else is
    printed and gives 1); an uncaught exception is printed through ``sys.excepthook``
    without this module's frames and gives 1; ``KeyboardInterrupt`` propagates as it
    would from the script.
    """
    sys.argv = target.argv
    if not target.module:
        sys.path[0] = str(Path(target.path).resolve().parent)
    try:
        if target.module:
            runpy.run_module(target.path, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target.path, run_name="__main__")
    except SystemExit as exc:
        return _exit_status(exc.code)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        frames = _script_frames(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(frames), frames)
        return 1
    return 0


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _script_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the first frame outside this launcher and runpy."""
    skip = {__file__, runpy.__file__, "<frozen runpy>"}
    while tb is not None and tb.tb_frame.f_code.co_filename in skip:
        tb = tb.tb_next
    return tb


def task_target(target: Target, layout: ClusterLayout, environ: MutableMapping[str, str]) -> Target:
    """``target`` as this task runs it: ``--data_dir`` (and ``DATA_DIR``) naming this
    node's copy when the job staged the data set (STAGE_DATA), and with ``cluster_flags``
    this task's ``--worker_hosts=... --task_index=N`` at the end of its arguments."""
    args = staged_args(target.args, environ)
    data_dir = environ.get("DATA_DIR")
    if data_dir:
        environ["DATA_DIR"] = resolve_data_dir(data_dir, environ) or data_dir
    if target.cluster_flags:
        args = (*args, *cluster_flags(layout))
    return dataclasses.replace(target, args=args, cluster_flags=False)


def launch_script(target: Target, environ: MutableMapping[str, str] = os.environ) -> int:
    """Everything above, in order: prepare the task, set the fixes, run ``target``."""
    allocator.tune()  # before TensorFlow's thread pools start (docs/SOAK.md)
    install.check_release()  # the script imports TensorFlow itself: its metadata only
    layout = prepare_task(environ)
    target = task_target(target, layout, environ)
    emit(
        "launch",
        rank=layout.task_index,
        job_id=layout.job_id or "",
        node=layout.node,
        restart_count=layout.restart_count,
        command=[sys.executable, *target.command],
        launcher="slurmtf.run",
        package=str(Path(slurmtf.__file__).resolve().parent),  # the slurmtf that runs it
        tf_config=layout.tf_config(),
    )
    install_fixes()
    teardown.prepare()
    status = run_target(target)
    if status in (EXIT_OK, EXIT_PREEMPTED):
        # A multi-worker script that ended well leaves with its peers, the leader last,
        # instead of having the leader report the others as crashed (no-op otherwise).
        teardown.leave_together(exit_code=status)
    return status
