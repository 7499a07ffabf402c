"""Tests that start TensorFlow (in-process or as real multi-process jobs on this machine)."""
