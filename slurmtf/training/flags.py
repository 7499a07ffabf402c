"""Command-line flags shared by the bundled models, in the spirit of TF's official models.

The flags are absl flags defined once per process by :func:`define_flags`; a model adds
its own and turns the parsed values into a :class:`TrainConfig` with :func:`config_from_flags`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from absl import flags

from slurmtf.errors import InputError
from slurmtf.spec.noderange import split_counts

STRATEGIES = ("auto", "off", "one_device", "mirrored", "multi_worker_mirrored")
ALL_REDUCE = ("auto", "ring", "nccl")
DTYPES = ("fp32", "fp16", "bf16")

_DEFINED: set[int] = set()


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Define the shared flags on ``flag_values`` (idempotent)."""
    if id(flag_values) in _DEFINED:
        return
    _DEFINED.add(id(flag_values))
    fv = flag_values
    _define_training_flags(fv)
    _define_distribution_flags(fv)
    _define_runtime_flags(fv)


def _define_training_flags(fv: flags.FlagValues) -> None:
    """What to train on and for how long: data, steps, evaluation, precision, schedule."""
    flags.DEFINE_string(
        "model_dir", None, "Checkpoints and summaries (chief only).", flag_values=fv
    )
    flags.DEFINE_string(
        "data_dir", None, "Dataset in its official format; synthetic data if unset.", flag_values=fv
    )
    flags.DEFINE_integer(
        "batch_size", 0, "GLOBAL batch size (all replicas); 0 = model default.", flag_values=fv
    )
    flags.DEFINE_integer("train_epochs", 1, "Epochs to train.", flag_values=fv)
    flags.DEFINE_integer("epochs_between_evals", 1, "Epochs between evaluations.", flag_values=fv)
    flags.DEFINE_integer(
        "train_steps", 0, "Total steps; overrides --train_epochs when > 0.", flag_values=fv
    )
    flags.DEFINE_integer(
        "eval_steps", 0, "Steps per evaluation; 0 = the whole eval set.", flag_values=fv
    )
    flags.DEFINE_float(
        "stop_threshold", None, "Stop once eval accuracy reaches this value.", flag_values=fv
    )
    flags.DEFINE_boolean(
        "eval_only", False, "Restore the latest checkpoint and evaluate.", flag_values=fv
    )
    flags.DEFINE_boolean(
        "evaluator",
        False,
        "Make the step's last task a sidecar evaluator (SLURMTF_JOBS=worker:N-1,evaluator:1): "
        "it evaluates every checkpoint as it appears, and the workers train without pausing.",
        flag_values=fv,
    )
    flags.DEFINE_string("export_dir", None, "Write a SavedModel here at the end.", flag_values=fv)
    flags.DEFINE_enum(
        "dtype", "fp32", DTYPES, "Compute precision (fp16 uses loss scaling).", flag_values=fv
    )
    flags.DEFINE_boolean("enable_xla", False, "Compile the train step with XLA.", flag_values=fv)
    flags.DEFINE_boolean(
        "use_synthetic_data", False, "Train on generated data even with --data_dir.", flag_values=fv
    )
    flags.DEFINE_float(
        "learning_rate",
        None,
        "Base learning rate for the model's reference batch; scaled linearly to --batch_size.",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "warmup_steps", None, "Linear learning-rate warm-up steps.", flag_values=fv
    )
    flags.DEFINE_integer(
        "seed", 0, "Random seed (weights, shuffling, synthetic data).", flag_values=fv
    )


def _define_distribution_flags(fv: flags.FlagValues) -> None:
    """How the replicas work together: strategy and all-reduce (and how long they wait)."""
    flags.DEFINE_enum(
        "distribution_strategy", "auto", STRATEGIES, "Distribution strategy.", flag_values=fv
    )
    flags.DEFINE_enum(
        "all_reduce_alg",
        "auto",
        ALL_REDUCE,
        "Collectives: NCCL on GPUs, RING on CPU.",
        flag_values=fv,
    )
    flags.DEFINE_enum(
        "allreduce_dtype",
        "fp32",
        ["fp32", "bf16", "fp16"],
        "Dtype gradients cross the network in: bf16 halves the bytes (fp32's range), fp16 "
        "too, scaled by a power of two per tensor so small gradients survive.",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "bytes_per_pack",
        0,
        "Split the gradient all-reduce into packs of this many bytes (0 = one pack).",
        flag_values=fv,
    )
    _define_cluster_flags(fv)
    _define_wait_flags(fv)


def _define_cluster_flags(fv: flags.FlagValues) -> None:
    """The cluster as TensorFlow's official models take it (slurmtf.cluster.flags)."""
    flags.DEFINE_string(
        "worker_hosts",
        None,
        "Comma-separated host:port of every worker, as TensorFlow's official models take "
        "the cluster. Outside Slurm: the cluster to train on (with --task_index). Inside a "
        "Slurm job the cluster comes from Slurm, and this must agree with it "
        "(`slurmtf resolve --flags`).",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "task_index",
        -1,
        "This process's place in --worker_hosts (0 is the chief); -1: not given.",
        flag_values=fv,
    )


def _define_wait_flags(fv: flags.FlagValues) -> None:
    """How long a rank waits for its peers before the run fails with a line naming them."""
    flags.DEFINE_float(
        "stall_timeout",
        120.0,
        "Fail the run when no training step finished for max(this, --stall_factor x the "
        "slowest recent step) seconds, naming the ranks that look stuck (0 = never).",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "stall_factor",
        20.0,
        "Multiple of the slowest recent step a rank may wait (see --stall_timeout).",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "collective_timeout",
        0.0,
        "Seconds one collective may wait for a peer (0 = no per-op limit). Costs one sleeping "
        "thread per collective op for that long: long runs exhaust threads; prefer "
        "--stall_timeout.",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "heartbeat_timeout",
        0.0,
        "Seconds without a heartbeat before a peer is declared dead (0 = TF default, 10).",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "registration_timeout",
        300.0,
        "Seconds every worker may take to join at start-up before the run fails, naming the "
        "missing ones; importing TensorFlow from a shared file system on many nodes can take "
        "minutes (0 = TF default: wait for a very long time).",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "cpu_replicas",
        0,
        "Split the CPU into N devices and mirror over them (multi-device path without GPUs).",
        flag_values=fv,
    )


def _define_runtime_flags(fv: flags.FlagValues) -> None:
    """Preemption, logging, threads and checkpoints."""
    flags.DEFINE_string(
        "preemption_signal", "USR2", "Signal that means: save and exit 75.", flag_values=fv
    )
    flags.DEFINE_integer("log_every", 100, "Print progress every N steps (chief).", flag_values=fv)
    flags.DEFINE_boolean(
        "log_all_ranks", False, "Let every rank print progress, not only the chief.", flag_values=fv
    )
    if "log_dir" not in fv:  # absl.logging defines it; we use it for the per-rank files
        flags.DEFINE_string(
            "log_dir",
            None,
            "Per-rank log files (rank<N>.log); default <model_dir>/logs.",
            flag_values=fv,
        )
    flags.DEFINE_integer(
        "num_threads", 0, "TensorFlow intra- and inter-op threads; 0 = TF default.", flag_values=fv
    )
    flags.DEFINE_integer(
        "checkpoint_every", 0, "Also save every N steps (0 = at each evaluation).", flag_values=fv
    )
    flags.DEFINE_integer("keep_checkpoints", 3, "Checkpoints kept by the chief.", flag_values=fv)
    flags.DEFINE_boolean(
        "async_checkpoint",
        True,
        "Write checkpoints in the background: a save stalls training only while the "
        "variables are copied into host memory (where the TensorFlow release can).",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "timing_every",
        30.0,
        "Every N seconds each rank prints its compute and all-reduce wait per step and its "
        "link rates (a `timing` event); the chief names stragglers (docs/CHECK.md). 0 = never.",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "straggler_window",
        120.0,
        "Seconds a rank must stay slow (or stay recovered) before the chief reports it.",
        flag_values=fv,
    )


# (field, lowest valid value, hint): TrainConfig's range checks.
_LOWER_BOUNDS: tuple[tuple[str, float, str], ...] = (
    ("batch_size", 1, "pass --batch_size=1 or more"),
    ("log_every", 1, "pass --log_every=1 or more"),
    ("train_epochs", 0, "pass --train_epochs=0 or more"),
    ("train_steps", 0, "pass --train_steps=0 or more"),
    ("eval_steps", 0, "pass --eval_steps=0 or more"),
    ("warmup_steps", 0, "pass --warmup_steps=0 or more"),
    ("num_threads", 0, "pass --num_threads=0 or more"),
    ("checkpoint_every", 0, "pass --checkpoint_every=0 or more"),
    ("cpu_replicas", 0, "pass --cpu_replicas=0 or more"),
    ("epochs_between_evals", 1, "pass 1"),
    ("stall_timeout", 0, "pass 0 for none"),
    ("stall_factor", 1, "e.g. --stall_factor=20"),
    ("collective_timeout", 0, "pass 0 for none"),
    ("heartbeat_timeout", 0, "pass 0 for TF's default"),
    ("registration_timeout", 0, "pass 0 for TF's default"),
    ("bytes_per_pack", 0, "0 = one pack"),
    ("keep_checkpoints", 1, "pass 1"),
    ("timing_every", 0, "pass 0 for none"),
    ("straggler_window", 0, "e.g. --straggler_window=120"),
)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Parsed, validated training options (values only; no TensorFlow)."""

    model_dir: str | None = None
    data_dir: str | None = None
    batch_size: int = 32
    train_epochs: int = 1
    epochs_between_evals: int = 1
    train_steps: int = 0
    eval_steps: int = 0
    stop_threshold: float | None = None
    eval_only: bool = False
    evaluator: bool = False
    export_dir: str | None = None
    dtype: str = "fp32"
    enable_xla: bool = False
    use_synthetic_data: bool = False
    learning_rate: float = 0.1
    warmup_steps: int | None = None  # None: the model's default warm-up
    seed: int = 0
    distribution_strategy: str = "auto"
    all_reduce_alg: str = "auto"
    allreduce_dtype: str = "fp32"
    bytes_per_pack: int = 0
    worker_hosts: str | None = None  # the official models' cluster flags (cluster_flags.py)
    task_index: int = -1
    stall_timeout: float = 120.0
    stall_factor: float = 20.0
    collective_timeout: float = 0.0
    heartbeat_timeout: float = 0.0
    registration_timeout: float = 300.0
    preemption_signal: str = "USR2"
    log_every: int = 100
    log_all_ranks: bool = False
    log_dir: str | None = None
    num_threads: int = 0
    checkpoint_every: int = 0
    keep_checkpoints: int = 3
    async_checkpoint: bool = True
    cpu_replicas: int = 0
    timing_every: float = 30.0
    straggler_window: float = 120.0
    batch_size_is_default: bool = False  # no --batch_size given: the model's default

    def __post_init__(self) -> None:
        for name, low, hint in _LOWER_BOUNDS:
            value = getattr(self, name)
            if value is not None and value < low:
                problem = "must not be negative" if low == 0 else f"must be at least {low:g}"
                raise InputError(f"--{name}", value, problem, hint)
        if self.train_steps == 0 and self.train_epochs == 0 and not self.eval_only:
            raise InputError(
                "--train_epochs", 0, "nothing to train", "pass --train_epochs or --train_steps"
            )
        if self.timing_every and self.straggler_window < self.timing_every:
            hint = f"pass --straggler_window={self.timing_every:g} or more"
            raise InputError(
                "--straggler_window", self.straggler_window, "is shorter than --timing_every", hint
            )
        if self.learning_rate <= 0:
            hint = "e.g. --learning_rate=0.1"
            raise InputError("--learning_rate", self.learning_rate, "must be positive", hint)

    @property
    def synthetic(self) -> bool:
        """True when the run trains on generated data."""
        return self.use_synthetic_data or not self.data_dir


def config_from_flags(
    flag_values: flags.FlagValues = flags.FLAGS,
    *,
    default_batch_size: int,
    default_learning_rate: float,
) -> TrainConfig:
    """Build a :class:`TrainConfig` from parsed flags and the model's defaults."""
    names = [f.name for f in dataclasses.fields(TrainConfig) if f.name != "batch_size_is_default"]
    values: dict[str, Any] = {name: flag_values[name].value for name in names}
    if not values["batch_size"]:
        values["batch_size"] = default_batch_size
        values["batch_size_is_default"] = True
    if values["learning_rate"] is None:
        values["learning_rate"] = default_learning_rate
    return TrainConfig(**values)


def nearest_batch(batch_size: int, replicas: int) -> int:
    """The multiple of ``replicas`` nearest to ``batch_size`` (the lower one on a tie)."""
    lower = batch_size // replicas * replicas
    upper = lower + replicas
    nearest = [v for v in (lower, upper) if v > 0]
    return min(nearest, key=lambda v: (abs(v - batch_size), v))


def fit_default_batch(config: TrainConfig, replicas: int) -> TrainConfig:
    """The model's default global batch, moved to the nearest multiple of ``replicas``.

    A batch the user chose is never changed (:func:`check_batch_size` names the fix);
    the default must work on any number of workers.
    """
    if not config.batch_size_is_default or config.batch_size % replicas == 0:
        return config
    return dataclasses.replace(config, batch_size=nearest_batch(config.batch_size, replicas))


def check_batch_size(batch_size: int, replicas: int, local_replicas: int = 1) -> int:
    """Return the per-replica batch; the global batch must split evenly over the replicas
    (``local_replicas`` on each worker). It stays the same on any worker count (a
    ``--nodes`` range), so the hint lists the worker counts it splits over."""
    if batch_size % replicas == 0:
        return batch_size // replicas
    best = nearest_batch(batch_size, replicas)
    raise InputError(
        "--batch_size",
        batch_size,
        f"the global batch does not split evenly over {replicas} replicas",
        f"use --batch_size={best} (nearest multiple of {replicas}), or a worker count "
        f"that splits it: {split_counts(batch_size, local_replicas)}",
    )


def scaled_learning_rate(base: float, batch_size: int, reference_batch: int) -> float:
    """Linear scaling rule: the learning rate grows with the global batch."""
    return base * batch_size / reference_batch
