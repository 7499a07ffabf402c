"""Slurm's commands and what each release does.

- ``runner``: the one subprocess runner, passed in so that tests can fake Slurm.
- ``scontrol``: the one parser of ``scontrol -o`` records.
- ``sacct``: ``sacct``'s ``ExitCode`` as each release prints it.
- ``release``: the one home of what each Slurm release does.
- ``resv_ports``: whether a cluster reserves ports and how a step asks for them.
- ``kill_timers``: whether a cluster's kill timers can drain a healthy node after another hangs.
- ``node_states``: what sinfo's node states leave a job requeued without some nodes.
- ``controller``: a controller that does not answer (Slurm's words read once, a brief retry).

May import: ``slurmtf.errors`` only.
"""
