"""A local multi-node Slurm cluster for trying job scripts and for end-to-end tests.

Python API: ``Sandbox(dir, nodes, gpus_per_node, link="")`` with ``up()``, ``down()``,
``status()``, ``env()`` and ``run(args)``. CLI: ``slurmtf sandbox up|status|down|env``
(:mod:`slurmtf.cli.sandbox`). See docs/SANDBOX.md.

May import: ``slurmtf.cluster`` (ports), ``slurmtf.firewall``, ``slurmtf.slurm`` and the
vocabulary; its ``__main__`` hands over to ``slurmtf.cli.sandbox``.
"""

from __future__ import annotations

from slurmtf.sandbox.core import Sandbox, SandboxError

__all__ = ["Sandbox", "SandboxError"]
