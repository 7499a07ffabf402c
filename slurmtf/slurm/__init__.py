"""Slurm's commands: the one subprocess runner (``runner``, passed in so that tests can
fake Slurm), the one parser of ``scontrol -o`` records (``scontrol``) and the one home of
what each Slurm release does (``release``).

May import: ``slurmtf.errors`` only.
"""
