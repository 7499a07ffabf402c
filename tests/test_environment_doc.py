"""docs/ENVIRONMENT.md against the code: every ``SLURMTF_*`` name in the package, the
models and the job scripts, every setting the settings reader and the job scripts read,
has a row; every row names files that exist and hold its names; no name has two rows in
one table. No Slurm, no TensorFlow."""

from __future__ import annotations

import ast
import collections
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "ENVIRONMENT.md"
SETTINGS = "slurmtf/runtime/job/settings.py"
# The tables: their section's heading and the column that names the files.
READS = ("## What slurmtf reads", 2)
SETS = ("## What slurmtf sets for the ranks", 1)
CODE_DIRS = ("slurmtf", "models", "jobs")
CODE_SUFFIXES = (".py", ".sh", ".sbatch")
JOB_SCRIPTS = (*sorted(p.relative_to(REPO).as_posix() for p in (REPO / "jobs").glob("*.sbatch")),
               "slurmtf/job.sh")  # fmt: skip
OURS = re.compile(r"\bSLURMTF_[A-Z0-9_]*[A-Z0-9]\b")
SHELL_READ = re.compile(r"\$\{([A-Z_][A-Z0-9_]*):?[-+]")


@dataclass(frozen=True)
class Row:
    names: tuple[str, ...]
    files: tuple[str, ...]
    line: int


def table(heading: str, files_column: int) -> list[Row]:
    """The rows of the table (or tables) under ``heading``, up to the next ``## ``."""
    lines = DOC.read_text().splitlines()
    start = lines.index(heading)
    rows = []
    for number, line in enumerate(lines[start + 1 :], start + 2):
        if line.startswith("## "):
            break
        if line.startswith("| `"):
            cells = line.strip().strip("|").split(" | ")
            names = tuple(re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[0]))
            files = tuple(re.findall(r"`([^`]+)`", cells[files_column]))
            rows.append(Row(names, files, number))
    return rows


def documented(heading: str, files_column: int) -> dict[str, Row]:
    return {name: row for row in table(heading, files_column) for name in row.names}


def code_files() -> list[Path]:
    return sorted(
        path
        for folder in CODE_DIRS
        for path in (REPO / folder).rglob("*")
        if path.suffix in CODE_SUFFIXES and "__pycache__" not in path.parts
    )


def settings_reads() -> set[str]:
    """The names ``JobSettings.read`` reads: its ``env.get("NAME"...)`` and ``env["NAME"]``."""
    tree = ast.parse((REPO / SETTINGS).read_text())
    reader = next(
        node
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef) and cls.name == "JobSettings"
        for node in cls.body
        if isinstance(node, ast.FunctionDef) and node.name == "read"
    )
    names = set()
    for node in ast.walk(reader):
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "get" and _is_env(node.func.value) and node.args:
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and _is_env(node.value):
            key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
    return names


def _is_env(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "env"


def test_the_tables_are_found() -> None:
    """The checks below read real tables, not an empty parse."""
    assert len(table(*READS)) > 60
    assert len(table(*SETS)) > 15


def test_every_slurmtf_name_in_the_code_has_a_row() -> None:
    names = {m for path in code_files() for m in OURS.findall(path.read_text())}
    assert len(names) > 20
    known = documented(*READS).keys() | documented(*SETS).keys()
    assert sorted(names - known) == []


def test_every_setting_the_settings_reader_reads_has_a_row_naming_it() -> None:
    reads = settings_reads()
    assert len(reads) > 25
    rows = documented(*READS)
    assert (
        sorted(name for name in reads if SETTINGS not in getattr(rows.get(name), "files", ())) == []
    )


@pytest.mark.parametrize("script", JOB_SCRIPTS)
def test_every_setting_a_job_script_reads_has_a_row_naming_it(script: str) -> None:
    reads = set(SHELL_READ.findall((REPO / script).read_text()))
    assert reads
    rows = documented(*READS)
    assert (
        sorted(name for name in reads if script not in getattr(rows.get(name), "files", ())) == []
    )


@pytest.mark.parametrize("heading", [READS, SETS], ids=["reads", "sets"])
def test_every_row_names_files_that_hold_its_names(heading: tuple[str, int]) -> None:
    """A stale row fails: a file that is gone, or that no longer holds the name."""
    stale = []
    for row in table(*heading):
        assert row.names, f"ENVIRONMENT.md:{row.line}: no name"
        assert row.files, f"ENVIRONMENT.md:{row.line}: no file"
        for file in row.files:
            path = REPO / file
            text = path.read_text() if path.is_file() else ""
            stale += [
                f"{row.line}: {name} in {file}" for name in row.names if not _holds(text, name)
            ]
    assert stale == []


def _holds(text: str, name: str) -> bool:
    """``NAME`` as a whole word; ``NAME_N`` (one per het component) as the prefix ``NAME_``."""
    if name.endswith("_N"):
        return re.search(rf"(?<![A-Z0-9_]){name[:-1]}", text) is not None
    return re.search(rf"(?<![A-Z0-9_]){name}(?![A-Z0-9_])", text) is not None


@pytest.mark.parametrize("heading", [READS, SETS], ids=["reads", "sets"])
def test_no_name_has_two_rows_in_a_table(heading: tuple[str, int]) -> None:
    counts = collections.Counter(name for row in table(*heading) for name in row.names)
    assert sorted(name for name, count in counts.items() if count > 1) == []
