"""Slurm's commands: the one subprocess runner (``runner``, passed in so that tests can
fake Slurm), the one parser of ``scontrol -o`` records (``scontrol``), the one home of
what each Slurm release does (``release``) and of when a step asks for reserved ports
(``resv_ports``).

May import: ``slurmtf.errors`` only.
"""
