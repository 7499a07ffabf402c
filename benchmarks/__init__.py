"""Benchmarks for slurmtf: run them all with ``python -m benchmarks.run_all``.

Benchmarks measure; they are not timed tests. See docs/BENCHMARKS.md.
"""
