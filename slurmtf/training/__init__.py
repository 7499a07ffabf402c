"""Distributed training shared by the bundled models (imports TensorFlow): the parts every
model needs once. ``import slurmtf`` never imports this package.

- ``app``: the models' entry point: flags, layout, strategy, loop.
- ``flags``: the command-line flags the models share.
- ``model_spec``: what a model tells the loop, and where this process runs in the job.
- ``process``: this process before it trains (threads, log file, batch, precision, seed).
- ``strategy``: the tf.distribute strategy from the layout and the flags.
- ``plan``: the step counts and learning-rate schedule of a run.
- ``loop``: the custom training loop, as the story of a run.
- ``phases``: its phases (build, train, evaluate, save, finish).
- ``steps``: the compiled training and evaluation steps.
- ``grad_reduce``: the gradient all-reduce in a smaller dtype, packed.
- ``checkpoints``: checkpoints the chief writes (the others pretend).
- ``rescue``: the survivors' save from memory at a peer's failure, which a restart resumes.
- ``export``: the chief's outputs (TensorBoard summaries, the SavedModel).
- ``trackers``: the same scalars in the user's MLflow and W&B runs, sent by a thread.
- ``preemption``: on the preemption signal every rank saves at the same step, exits 75;
  SIGTERM held until the step ends.
- ``watchdog``: one thread per rank that fails a run that stops making progress.
- ``steptiming``: each rank's compute and all-reduce wait per step; stragglers reported.
- ``allocation``: the allocation in TensorBoard (the chief's per-window scalars and texts).
- ``fit_board``: the same allocation run for ``model.fit`` (``slurmtf.fit.AllocationBoard``).
- ``gpu_query``: GPU utilisation and memory from ``nvidia-smi``, off the step's path.
- ``reporting``: per-rank log files and the chief's progress lines.
- ``sidecar``: the sidecar evaluator (an ``evaluator`` task evaluates each checkpoint).

May import: ``slurmtf.runtime`` (teardown, allocator, chief watch, the recovery record),
``slurmtf.tf``, ``slurmtf.cluster``, ``slurmtf.spec`` (node ranges), ``slurmtf.check`` (stragglers),
``slurmtf.datasets``, ``slurmtf.resolver``, ``slurmtf.monitor.tracking`` and ``tracker_runs``
(the tracker run each rank gets) and the vocabulary; ``app`` (the models'
``main``, a front end) also ``slurmtf.cli``.
"""

from __future__ import annotations
