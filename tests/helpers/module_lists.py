"""docs/ARCHITECTURE.md's module lists, generated from the package docstrings.

Each package's ``__init__`` docstring lists its modules, one line each (``- ``name``: what
it holds``; tests/test_package_layout.py holds each list equal to the package's files).
``python3 -m tests.helpers.module_lists`` writes those lists into docs/ARCHITECTURE.md
between :data:`BEGIN` and :data:`END`; tests/test_package_layout.py fails when the text
there differs from what this renders.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
BEGIN = "<!-- module lists: python3 -m tests.helpers.module_lists -->"
END = "<!-- end of module lists -->"
ITEM = re.compile(r"^- ``(\w+)``: (.+?)(?=^- ``|^\s*$|\Z)", re.M | re.S)


def packages() -> list[str]:
    """Every package of slurmtf, by its dotted name."""
    inits = sorted((ROOT / "slurmtf").rglob("__init__.py"))
    return [".".join(p.parent.relative_to(ROOT).parts) for p in inits]


def listed(package: str) -> list[tuple[str, str]]:
    """The ``(module, what it holds)`` lines of ``package``'s docstring, in its order."""
    doc = importlib.import_module(package).__doc__ or ""
    return [(name, " ".join(text.split())) for name, text in ITEM.findall(doc)]


def render() -> str:
    """The section between the markers: one table per package that lists modules."""
    parts = [BEGIN]
    for package in packages():
        rows = listed(package)
        if not rows:
            continue
        folder = package.replace(".", "/")
        parts += ["", f"`{folder}/`", "", "| module | what it holds |", "| --- | --- |"]
        parts += [f"| `{name}` | {text.replace('|', '/')} |" for name, text in rows]
    parts += ["", END]
    return "\n".join(parts)


def current(text: str) -> str:
    """What the document holds between the markers ("" without them)."""
    if BEGIN not in text or END not in text:
        return ""
    return text[text.index(BEGIN) : text.index(END) + len(END)]


def main() -> int:
    text = DOC.read_text()
    if not current(text):
        print(f"{DOC}: no {BEGIN} ... {END} block to fill", file=sys.stderr)
        return 1
    DOC.write_text(text.replace(current(text), render()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
