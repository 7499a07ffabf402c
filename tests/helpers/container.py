"""A stand-in for ``apptainer exec [OPTIONS] IMAGE COMMAND...`` (Apptainer is not packaged
for Debian 12): it appends one JSON line with its arguments, the rank and the node to
``$STANDIN_RECORD`` and then runs COMMAND, as the real one runs it inside the image."""

from __future__ import annotations

import json
import sys
from pathlib import Path

STANDIN = """#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
record = {"argv": args, "rank": os.environ.get("SLURM_PROCID"),
          "node": os.environ.get("SLURMD_NODENAME"), "step": os.environ.get("SLURM_STEP_ID")}
with open(os.environ["STANDIN_RECORD"], "a") as out:
    out.write(json.dumps(record) + "\\n")
assert args[0] == "exec", args
rest = args[1:]
while rest and rest[0].startswith("-"):  # apptainer's options (--nv, --bind X)
    rest = rest[2:] if rest[0] in ("--bind", "-B") else rest[1:]
os.execvp(rest[1], rest[1:])  # rest[0] is the image
"""


def write_standin(folder: Path) -> Path:
    """The stand-in executable ``folder/apptainer``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "apptainer"
    path.write_text(STANDIN.replace("/usr/bin/env python3", sys.executable, 1))
    path.chmod(0o755)
    return path


def records(path: Path) -> list[dict[str, object]]:
    """The stand-in's lines (none when it never ran)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
