"""Watching a job: its state and logs (``status``: ``slurmtf status|logs`` and the
``--wait`` follower), what Slurm says of it, asked once, or that the controller did not
answer (``slurm_view``), what its own files say (``job_logs``), where its logs are
(``records``), events as human lines (``console``), its pictures (``plot``), a sweep's
results (``sweep_rows``, pure; ``sweeps``, from Slurm and the logs), TensorBoard over its
runs (``board``) and a sweep in TensorBoard's HParams dashboard (``hparams``).

May import: ``slurmtf.slurm``, ``slurmtf.spec``, ``slurmtf.check`` (stragglers) and the
vocabulary. Never TensorFlow (TensorBoard's package, optional, runs without it).
"""
