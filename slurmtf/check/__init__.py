"""``slurmtf check``: what slows an allocation, node by node (docs/CHECK.md). The front end
is ``slurmtf.cli.check``.

- ``verdict``: per-node measurements in, outliers and a table out (pure).
- ``outliers``: the one outlier rule (by the median), shared with ``stragglers``.
- ``mesh``: plain TCP between the ranks of a check step (an all-gather, timed streams).
- ``probe``: one rank of the check step (TensorFlow inside).
- ``stragglers``: stragglers in a running job, from the ranks' timing samples (pure).

May import: ``slurmtf.cluster``, ``slurmtf.tf``, ``slurmtf.resolver`` and the vocabulary
(``errors``, ``events``, ``contracts``).
"""
