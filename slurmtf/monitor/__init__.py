"""Watching a job.

- ``status``: its state and logs (``slurmtf status|logs``, the ``--wait`` follower).
- ``slurm_view``: what Slurm says of it, asked once, or that the controller did not answer.
- ``job_logs``: what its own files say.
- ``failure_cost``: what its failures cost: seconds, steps redone, goodput (pure).
- ``records``: where its logs are (the user's record of submitted jobs, Slurm's Comment).
- ``console``: events as the lines a person reads.
- ``plot``: its pictures (loss, accuracy, examples/s).
- ``sweep_rows``: a sweep's results table, from values (pure).
- ``sweeps``: a sweep's points, from Slurm and the logs.
- ``board``: TensorBoard over its runs (``slurmtf tensorboard``).
- ``hparams``: a sweep in TensorBoard's HParams dashboard.
- ``tracking``: one MLflow / W&B run per job, the ids and each rank's variables (pure).
- ``tracker_runs``: the job's MLflow run, found or made on the server (the edge).

May import: ``slurmtf.slurm``, ``slurmtf.spec``, ``slurmtf.check`` (stragglers),
``slurmtf.runtime.recovery.record`` (the job's recovery record, read), ``slurmtf.cluster.env``
(the job's ids) and the vocabulary. Never TensorFlow (TensorBoard's package, optional, runs
without it); MLflow only in ``tracker_runs``, when the job uses it.
"""
