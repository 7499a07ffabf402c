"""``--cluster=local``: one Slurm step on this machine (``step``: rank environments,
free ports, starting ranks) and a whole job as local processes (``job``).

May import: ``slurmtf.runtime``, ``slurmtf.spec``, ``slurmtf.cluster``,
``slurmtf.monitor`` and the vocabulary.
"""
