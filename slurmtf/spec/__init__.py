"""The job a user asks for, as values. Pure but for ``shell`` (runs ``bash -n``) and
``bundled`` (reads package files).

- ``values``: flag values parsed and checked (times, signals, sweeps, sbatch options).
- ``noderange``: node-count ranges (``--nodes=2-4``) and what a job that changes size says.
- ``jobspec``: the ``JobSpec`` and its sbatch rendering.
- ``bundled``: the job scripts the package ships, and writing them into a folder.
- ``shell``: bash's own syntax check of setup lines.

May import: ``slurmtf.cluster`` (roles), ``slurmtf.errors``, ``slurmtf.contracts``.
"""
