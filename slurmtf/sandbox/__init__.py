"""A local multi-node Slurm cluster for trying job scripts and for end-to-end tests.

Python API: ``Sandbox(dir, nodes, gpus_per_node, link="")`` with ``up()``, ``down()``,
``status()``, ``env()`` and ``run(args)``. CLI: ``slurmtf sandbox up|status|down|env``
(:mod:`slurmtf.cli.sandbox`). See docs/SANDBOX.md.

- ``core``: the cluster (munged, slurmctld, N slurmd), all its state in one folder.
- ``config``: its files (slurm.conf, gres.conf, hosts, env) rendered from values (pure).
- ``daemons``: its daemons started and stopped by PID, and what they left behind.
- ``port_slices``: a new sandbox's step ports, apart from every running sandbox's.
- ``links``: nodes joined by real, rate-limited links (a network namespace each).
- ``nodefaults``: one node broken the ways real nodes break, and mended.
- ``competitor``: another user's job waiting for the same nodes.
- ``sacct``: a stand-in ``sacct`` (the sandbox has no accounting database).

May import: ``slurmtf.cluster`` (ports), ``slurmtf.firewall``, ``slurmtf.slurm`` and the
vocabulary; its ``__main__`` hands over to ``slurmtf.cli.sandbox``.
"""

from __future__ import annotations

from slurmtf.sandbox.core import Sandbox, SandboxError

__all__ = ["Sandbox", "SandboxError"]
