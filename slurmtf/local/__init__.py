"""``--cluster=local``: the job as local processes.

- ``step``: one Slurm step on this machine (rank environments, free ports, starting ranks).
- ``job``: a whole job as local processes, restarted and decided as the job scripts do.

May import: ``slurmtf.runtime``, ``slurmtf.spec``, ``slurmtf.cluster``,
``slurmtf.monitor`` and the vocabulary.
"""
