"""Input pipelines for the bundled models: real formats, sharded per worker, and synthetic data."""

from __future__ import annotations
