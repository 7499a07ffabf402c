"""Where a task sits: the pure core that turns Slurm's environment into a cluster.

- ``env``: the one reader of Slurm's variables (and slurmtf's) into a frozen ``SlurmEnv``.
- ``hostlists``: Slurm's hostlists and task counts.
- ``placement``: which node runs which rank of a step (the distribution, heterogeneous steps).
- ``roles``: chief, ps, worker, evaluator: one role per rank.
- ``gpu_ids``: GPU ids as Slurm writes them.
- ``gpu_plan``: which GPUs each task uses.
- ``ports``: the workers' ports (the scheme; a free port; ports for a local step).
- ``port_claims``: free local ports handed out, claimed in a lock file so no two steps meet.
- ``layout``: ``ClusterLayout``: every rank's node, role, address and ``TF_CONFIG``.
- ``flags``: a layout as the official models' ``--worker_hosts``/``--task_index``, and back.
- ``step_flags``: srun's GPU and CPU flags that follow from how the job asked for them.

May import: ``slurmtf.errors``, ``slurmtf.contracts`` and each other. Never TensorFlow,
never a subprocess.
"""
