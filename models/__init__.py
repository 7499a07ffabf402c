"""Bundled models: MNIST and ResNet trained across a Slurm allocation."""
