"""The code names docs/ARCHITECTURE.md's concept table gives, checked against the code.

Each row's cells name a module by its path (`` `slurmtf/runtime/job/follow.py` ``, or one
relative to the last path: `` `record.py` ``), then the names it holds (`` `EventFollower` ``,
`` `Training.build/train` ``, `` `after_step.decide_and_record` ``). A name must be found in
the module the row gave it (or the module its dotted prefix names): a function, class,
variable, attribute, argument or string it holds; a module or package of slurmtf; or a
variable of docs/ENVIRONMENT.md. Read with ``ast``: nothing is imported.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
SECTION = "## Where each concept lives"
TOP_FOLDERS = ("slurmtf/", "jobs/", "benchmarks/", "tests/", "models/", "scripts/")
PATH = re.compile(r"^([\w./]+\.(?:py|sh|sbatch))(?: (\w[\w.]*))?$")
NAME = re.compile(r"^[A-Za-z_][\w.]*$")


def rows(text: str) -> Iterator[str]:
    """The table rows of the concept section."""
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith(("| ---", "| concept")):
            yield line


@functools.cache
def names_in(path: Path) -> frozenset[str]:
    """Every name a file defines or mentions (for shell: its functions and variables)."""
    if not path.is_file():
        return frozenset()  # a folder's stand-in (`jobs/`): its files are named after it
    text = path.read_text()
    if path.suffix in (".sh", ".sbatch"):
        return frozenset(re.findall(r"^\s*(\w+)\s*(?:\(\)|=)", text, re.M))
    found: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.alias):
            found.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
            found.update(re.findall(r"``(\w+)``", node.value))  # what its docstrings name
    return frozenset(found)


@functools.cache
def modules() -> dict[str, list[Path]]:
    """slurmtf's modules and packages by their last name."""
    found: dict[str, list[Path]] = {}
    for path in sorted((ROOT / "slurmtf").rglob("*.py")):
        name = path.parent.name if path.name == "__init__.py" else path.stem
        found.setdefault(name, []).append(path)
    return found


@functools.cache
def classes() -> dict[str, list[Path]]:
    """The modules that define each class of slurmtf."""
    found: dict[str, list[Path]] = {}
    for path in sorted((ROOT / "slurmtf").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(path)
    return found


@functools.cache
def environment_names() -> frozenset[str]:
    return frozenset(
        re.findall(r"`([A-Z][A-Z0-9_]+)`", (ROOT / "docs" / "ENVIRONMENT.md").read_text())
    )


def file_of(token: str, current: Path | None) -> Path | None:
    """The file a path token names: from the root, else beside the row's last file or in a
    folder above it."""
    if token.startswith(TOP_FOLDERS):
        return ROOT / token
    folder = current.parent if current is not None else ROOT / "slurmtf"
    while folder != ROOT.parent:
        if (folder / token).exists():
            return folder / token
        folder = folder.parent
    return None


def module_of(dotted: list[str]) -> tuple[Path | None, list[str]]:
    """The longest dotted prefix that names a slurmtf module, and the rest."""
    for cut in range(len(dotted), 0, -1):
        last = dotted[cut - 1]
        for path in modules().get(last, []):
            parents = dotted[: cut - 1]
            if all(part in path.parts for part in parents):
                return path, dotted[cut:]
    return None, dotted


def unknown(name: str, current: Path | None) -> bool:
    """Whether ``name`` (``a``, ``Class.member``, ``module.name``) is nowhere it should be."""
    parts = name.split(".")
    if current is not None and all(part in names_in(current) for part in parts):
        return False
    module, rest = module_of(parts)
    if module is not None and all(part in names_in(module) for part in rest):
        return False
    if any(all(p in names_in(path) for p in parts[1:]) for path in classes().get(parts[0], [])):
        return False  # Class.member, the class defined elsewhere
    return not (len(parts) == 1 and (name in modules() or name in environment_names()))


def stale_names(text: str | None = None) -> list[str]:
    """``file: name`` for each name of the concept table that the code does not have, and
    each path that is not a file."""
    text = DOC.read_text() if text is None else text
    stale: list[str] = []
    for row in rows(text):
        for cell in row.strip("|").split("|"):
            stale.extend(stale_in(cell))
    return stale


def stale_in(cell: str) -> Iterator[str]:
    """What :func:`stale_names` finds in one cell, each name against the file before it."""
    current: Path | None = None
    for token in re.findall(r"`([^`]+)`", cell):
        names = token
        if token.startswith(TOP_FOLDERS) and token.endswith("/"):
            current = ROOT / token / "__init__.py"  # the names after it: its modules
            continue
        path_match = PATH.match(token)
        if path_match:
            current = file_of(path_match.group(1), current)
            if current is None or not current.is_file():
                current = None
                yield f"no such file: {path_match.group(1)}"
                continue
            names = path_match.group(2) or ""
        if current is None:
            continue  # a name before the cell's first path: a concept's words
        for name in (part.strip().removesuffix("()") for part in names.split("/")):
            if NAME.match(name) and unknown(name, current):
                yield f"{current.relative_to(ROOT)}: {name}"
