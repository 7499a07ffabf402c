"""Slurm's commands: the one subprocess runner (``runner``, passed in so that tests can
fake Slurm) and the one parser of ``scontrol -o`` records (``scontrol``).

May import: ``slurmtf.errors`` only.
"""
