"""slurmtf's test suite.

Imported before any test module, conftest included: the suite starts the checkout's own
modules in hundreds of processes (CLIs, supervisors, ranks). Where the environment forbids
byte-code caches (``PYTHONDONTWRITEBYTECODE``, which container images often set), each of
those processes compiled them anew and pytest rewrote every test module's asserts on every
run: collecting the fast tier took 23.7 s instead of 4.7 s (2-core machine, loaded). The
suite allows caches again, for itself and the processes it starts; they go to the
checkout's ``__pycache__`` folders, which git ignores.
"""

import os
import sys

sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
