"""What runs inside the allocation: what runs in a rank's process (``rank``: the launchers,
the servers, the watch on the chief, the end of a multi-worker process, the malloc settings,
a rank's port found held by another process) and what decides a job's next step after one
ends (``recovery``: the decision; ``node_choice``: the nodes it trains on; ``endings``: how
an attempt ended).

May import: ``slurmtf.cluster``, ``slurmtf.spec``, ``slurmtf.slurm``, ``slurmtf.tf``,
``slurmtf.datasets`` (a staged data set), ``slurmtf.resolver`` and the vocabulary
(``errors``, ``events``, ``contracts``).
TensorFlow only inside functions that start it.
"""
