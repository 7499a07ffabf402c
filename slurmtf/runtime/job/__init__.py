"""The batch job's one loop, from its settings to its exit status (``slurmtf job KIND``,
which every job script hands over to):

- ``settings``: the job's settings, read once from the batch script's environment.
- ``srun_flags``: srun's task, CPU, GPU and reserved-port flags for a training step.
- ``step_nodes``: the nodes the next step runs on (``--nodelist``, ``--exclude``).
- ``commands``: what each kind of job runs on its ranks; slurmtf's own commands.
- ``children``: each srun a child in its own process group, ended with bounded waits.
- ``follow``: the ranks' event lines and srun's stderr, followed as a step writes them.
- ``staging``: a data set staged on every node before training, removed at the end.
- ``check_first``: ``CHECK_FIRST=1``'s ``slurmtf check`` before training.
- ``warm``: the next attempt's warm ranks: a step started early, told to go or to go away.
- ``beacon``: a word a second from every node, so that a silent node is lost without a probe.
- ``supervisor``: the loop: start a step, watch it, decide, restart, requeue or stop.

May import: ``slurmtf.runtime.recovery``, ``slurmtf.runtime.batch_host``,
``slurmtf.runtime.rank.launcher`` (the ranks' environment), ``slurmtf.runtime.slurm_calls``,
``slurmtf.runtime.job_log``, ``slurmtf.monitor.records`` (the user's record of jobs),
``slurmtf.cluster``, ``slurmtf.slurm``, ``slurmtf.datasets``, ``slurmtf.tf`` and the
vocabulary (``errors``, ``events``, ``contracts``).
"""
