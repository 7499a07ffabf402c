"""Bundled models: MNIST and ResNet trained across a Slurm allocation.

``models`` in a checkout (``python -m models.mnist``, as ``jobs/*.sbatch`` run them),
``slurmtf_models`` once slurmtf is installed (``python -m slurmtf_models.mnist``, as
``slurmtf submit --model=...`` runs them): imports inside are relative, so both work.
"""
