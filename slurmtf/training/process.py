"""This process before it trains or evaluates: its threads, its log file, and the global
batch with Keras's precision policy and seed. The workers and the sidecar evaluator set
themselves up alike."""

from __future__ import annotations

from absl import logging

from slurmtf.tf import compat, install
from slurmtf.training import reporting
from slurmtf.training.flags import TrainConfig, check_batch_size, fit_default_batch
from slurmtf.training.model_spec import RunInfo


def log_dir(config: TrainConfig) -> str | None:
    """Per-rank logs and progress records: ``--log_dir``, else ``<model_dir>/logs``."""
    return config.log_dir or (f"{config.model_dir}/logs" if config.model_dir else None)


def set_up_process(config: TrainConfig, info: RunInfo) -> tuple[int, str | None]:
    """Threads, per-rank logging; returns the GPUs TensorFlow sees and the log file."""
    tf = install.import_tensorflow()
    if config.num_threads:
        tf.config.threading.set_intra_op_parallelism_threads(config.num_threads)
        tf.config.threading.set_inter_op_parallelism_threads(config.num_threads)
    log_path = reporting.setup_logging(
        info.rank, info.is_chief, log_dir(config), config.log_all_ranks
    )
    install.check_gpus(tf, info.layout.cuda_visible_devices)
    return len(tf.config.list_physical_devices("GPU")), log_path


def fit_batch(config: TrainConfig, replicas: int, workers: int) -> tuple[TrainConfig, int]:
    """The config with a global batch that splits over ``replicas``; the per-replica batch.

    Also sets Keras's precision policy and seed (before the model is built).
    """
    import keras

    fitted = fit_default_batch(config, replicas)
    if fitted.batch_size != config.batch_size:
        logging.warning(
            "The default global batch %d does not split over %d replicas: using %d "
            "(--batch_size sets it)",
            config.batch_size,
            replicas,
            fitted.batch_size,
        )
        config = fitted
    per_replica = check_batch_size(config.batch_size, replicas, replicas // workers)
    policy = {"fp32": "float32", "fp16": "mixed_float16", "bf16": "mixed_bfloat16"}[config.dtype]
    compat.set_precision_policy(keras, policy)
    keras.utils.set_random_seed(config.seed)
    return config, per_replica
