"""The job a user asks for, as values: flag values (``values``), node ranges
(``noderange``), the ``JobSpec`` and its sbatch rendering (``jobspec``), the job scripts
the package ships (``bundled``) and the ``bash -n`` check of setup lines (``shell``).

May import: ``slurmtf.cluster`` (roles), ``slurmtf.errors``, ``slurmtf.contracts``.
Pure but for ``shell`` (runs ``bash -n``) and ``bundled`` (reads package files).
"""
