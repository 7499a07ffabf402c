"""Slurm's commands: the one subprocess runner (``runner``, passed in so that tests can
fake Slurm), the one parser of ``scontrol -o`` records (``scontrol``), the one home of
what each Slurm release does (``release``), of when a step asks for reserved ports
(``resv_ports``) and of a controller that does not answer (``controller``: Slurm's words
read once, the brief retry of commands that need it).

May import: ``slurmtf.errors`` only.
"""
