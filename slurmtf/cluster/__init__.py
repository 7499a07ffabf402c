"""Where a task sits: the pure core that turns Slurm's environment into a cluster.

``env`` (the one reader of ``SLURM_*``/``SLURMTF_*``), ``hostlists`` (Slurm's hostlists
and task counts), ``placement`` (which node runs which rank), ``roles`` (chief, ps,
worker, evaluator), ``gpu_ids`` (GPU ids as Slurm writes them), ``gpu_plan`` (which GPUs
each task uses), ``ports`` and ``layout`` (``ClusterLayout``: every rank's node, role,
address and ``TF_CONFIG``), ``flags`` (a layout as the official models'
``--worker_hosts``/``--task_index``, and those flags as a layout).

May import: ``slurmtf.errors``, ``slurmtf.contracts`` and each other. Never TensorFlow,
never a subprocess.
"""
