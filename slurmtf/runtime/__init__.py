"""What runs inside the allocation, on every task: the launcher of ``slurmtf submit``'s
tasks (``launcher``), the launcher of unmodified scripts (``script``, ``slurmtf run``),
the servers of a parameter-server job (``servers``, ``slurmtf serve``), the watch on the
chief (``chief_watch``), the end of a multi-worker process (``teardown``), the malloc
settings of training processes (``allocator``), a rank's port found held by another
process (``held_port``) and what decides a job's next step after one ends (``recovery``:
the decision; ``node_choice``: the nodes it trains on; ``endings``: how an attempt ended).

May import: ``slurmtf.cluster``, ``slurmtf.spec``, ``slurmtf.slurm``, ``slurmtf.tf``,
``slurmtf.datasets`` (a staged data set), ``slurmtf.resolver`` and the vocabulary
(``errors``, ``events``, ``contracts``).
TensorFlow only inside functions that start it.
"""
