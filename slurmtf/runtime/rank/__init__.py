"""What runs in a rank's process, from its start to its end (TensorFlow only inside the
functions that start it):

- ``launcher``: each task of a ``slurmtf submit`` job (``TaskLauncher``, which submitit pickles).
- ``script``: an unmodified training script, as ``python SCRIPT`` would run it (``slurmtf run``).
- ``servers``: the ps and worker servers of a parameter-server job (``slurmtf serve``).
- ``chief_watch``: whether a job's chief still runs, by its port.
- ``held_port``: a rank's port found held by another process (the ``port_in_use`` event).
- ``allocator``: glibc's malloc settings for a long training process.
- ``teardown``: the end of a multi-worker process (the ranks leave together).
- ``temp_folder``: a rank's own temporary folder (a killed rank's files go with its slot).
- ``standby``: a warm rank: started before it is needed, it waits for its supervisor's word.

May import: ``slurmtf.cluster``, ``slurmtf.spec``, ``slurmtf.tf``, ``slurmtf.datasets``
(a staged data set), ``slurmtf.resolver`` and the vocabulary (``errors``, ``events``,
``contracts``); nothing else of ``slurmtf.runtime``.
"""
