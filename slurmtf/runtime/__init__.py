"""What runs inside the allocation, laid out by the life of a job:

- ``job``: the batch job's one loop (``slurmtf job KIND``): settings, steps, the supervisor.
- ``rank``: what runs in a rank's process: the launchers, the servers, the end of a rank.
- ``recovery``: what follows an attempt: how it ended, the nodes, the decision, its record.
- ``batch_host``: what outlives the batch host: the keeper, the heartbeat, the watcher.
- ``slurm_calls``: every Slurm call the batch job's own processes make.
- ``job_log``: the job's log, which the batch side and the watcher write.

Each subpackage says what it may import; ``rank`` imports nothing else of
``slurmtf.runtime``, ``recovery`` only ``slurm_calls`` and ``rank.held_port``.

May import: ``slurmtf.cluster``, ``slurmtf.spec``, ``slurmtf.slurm``, ``slurmtf.tf``,
``slurmtf.datasets`` (a staged data set), ``slurmtf.resolver``, ``slurmtf.monitor.records``
(the user's record of jobs, a line per job) and the vocabulary (``errors``, ``events``,
``contracts``). TensorFlow only inside functions that start it.
"""
