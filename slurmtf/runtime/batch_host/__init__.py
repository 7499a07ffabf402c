"""What outlives the batch host and its supervisor:

- ``keeper``: the batch script's own process, which starts its supervisor again when it dies.
- ``keeper_death``: the supervisor told of its keeper's death; both processes' titles.
- ``heartbeat``: the supervisor's heartbeat (a one-line file, a pulse on the keeper's pipe).
- ``watcher``: the watcher, on another node, which requeues the job when the batch host is lost.
- ``watcher_step``: the watcher as a step of the job, kept running by the supervisor.
- ``succession``: what a supervisor says and does of the one before it in the same job.

May import: ``slurmtf.runtime.job`` (the settings, the children, the first step's nodes),
``slurmtf.runtime.recovery`` (the decisions about the batch side, the record),
``slurmtf.runtime.slurm_calls``, ``slurmtf.runtime.job_log``, ``slurmtf.cluster``,
``slurmtf.slurm`` and the vocabulary (``contracts``).
"""
