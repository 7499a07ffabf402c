"""A stand-in for ``apptainer exec [OPTIONS] IMAGE COMMAND...`` (Apptainer is not packaged
for Debian 12): it appends one JSON line with its arguments, the rank, the node and the
interpreter it ran to ``$STANDIN_RECORD``, and then runs COMMAND as the real one runs it
inside the image: a bare name is looked up in the image first (``image-bin/``, whose
``python3`` stands for the image's own interpreter and runs this test's one), and an
absolute path the image does not hold ends with apptainer's FATAL line and status 255, as
the submitting interpreter's path does in a real image."""

from __future__ import annotations

import json
import sys
from pathlib import Path

IMAGE_PYTHON = "image:python3"  # what a record says when the image's python3 ran

STANDIN = """#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
assert args[0] == "exec", args
rest = args[1:]
while rest and rest[0].startswith("-"):  # apptainer's options (--nv, --bind X)
    rest = rest[2:] if rest[0] in ("--bind", "-B") else rest[1:]
image_bin = os.path.join(os.path.dirname(os.path.abspath(__file__)), "image-bin")
program = rest[1]  # rest[0] is the image
inside = os.path.join(image_bin, program)
if "/" not in program and os.path.exists(inside):
    interpreter, run = f"image:{program}", inside
elif "/" in program and not program.startswith(image_bin):
    interpreter, run = program, None
else:
    interpreter, run = program, program
record = {"argv": args, "rank": os.environ.get("SLURM_PROCID"),
          "node": os.environ.get("SLURMD_NODENAME"), "step": os.environ.get("SLURM_STEP_ID"),
          "interpreter": interpreter}
with open(os.environ["STANDIN_RECORD"], "a") as out:
    out.write(json.dumps(record) + "\\n")
if run is None:
    print(f"FATAL:   stat {program}: no such file or directory", file=sys.stderr)
    sys.exit(255)
os.execvp(run, [run, *rest[2:]])
"""

IMAGE_PYTHON_SCRIPT = """#!/bin/sh
exec "{python}" "$@"
"""


def write_standin(folder: Path) -> Path:
    """The stand-in executable ``folder/apptainer`` and its image's ``python3``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "apptainer"
    path.write_text(STANDIN.replace("/usr/bin/env python3", sys.executable, 1))
    path.chmod(0o755)
    image_bin = folder / "image-bin"
    image_bin.mkdir(exist_ok=True)
    python = image_bin / "python3"
    python.write_text(IMAGE_PYTHON_SCRIPT.format(python=sys.executable))
    python.chmod(0o755)
    return path


def records(path: Path) -> list[dict[str, object]]:
    """The stand-in's lines (none when it never ran)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
