"""``slurmtf check``: what slows an allocation, node by node (docs/CHECK.md).

``verdict`` is pure (measurements in, outliers out); ``mesh`` (TCP between the ranks)
and ``probe`` (one rank of the check step, TensorFlow inside) are the edges;
``slurmtf.cli.check`` is the front end.

May import: ``slurmtf.cluster``, ``slurmtf.tf``, ``slurmtf.resolver`` and the vocabulary
(``errors``, ``events``, ``contracts``). ``stragglers`` (stragglers in a running job, from
the ranks' timing samples) is pure and shares ``verdict``'s outlier test.
"""
