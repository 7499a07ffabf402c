"""The TensorFlow release differences of slurmtf.tf, without TensorFlow: how the ServerDef
is found, and that each difference is marked in its module and listed in
docs/TENSORFLOW_VERSIONS.md's table."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurmtf.tf import coordination

COLLECTIVE, REMOTE = object(), object()


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        ({"_collective_ops_server_def": COLLECTIVE, "_server_def": None}, COLLECTIVE),
        ({"_collective_ops_server_def": None, "_server_def": REMOTE}, REMOTE),
        ({"_server_def": REMOTE}, REMOTE),  # a release without the collective ops' one
        ({"_collective_ops_server_def": None, "_server_def": None}, None),
        ({}, None),
    ],
)
def test_the_server_def_is_collective_ops_else_remote_eager(
    attributes: dict[str, object], expected: object
) -> None:
    assert coordination.server_def(SimpleNamespace(**attributes)) is expected


# Every release difference handled in slurmtf/tf/ is in docs/TENSORFLOW_VERSIONS.md's table.
ROOT = Path(__file__).resolve().parents[1]
TF = ROOT / "slurmtf" / "tf"
WHOLLY = ("compat.py", "coordination.py")  # modules that hold release differences only


def marked(path: Path) -> tuple[str, ...]:
    """The module's ``RELEASE_DIFFERENCES`` (read from its source: no TensorFlow)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "RELEASE_DIFFERENCES" for t in node.targets
        ):
            return tuple(ast.literal_eval(node.value))
    return ()


def public(path: Path) -> set[str]:
    kinds = (ast.FunctionDef, ast.ClassDef)
    body = ast.parse(path.read_text()).body
    return {n.name for n in body if isinstance(n, kinds) and not n.name.startswith("_")}


def table_rows() -> list[list[str]]:
    """The cells of each row of the table in "Differences handled"."""
    text = (ROOT / "docs" / "TENSORFLOW_VERSIONS.md").read_text()
    section = text.split("\n## Differences handled\n", 1)[1].split("\n## ", 1)[0]
    lines = [x for x in section.splitlines() if x.startswith("| ") and not x.startswith("| ---")]
    return [[c.strip() for c in line.strip("| ").split(" | ")] for line in lines[1:]]


MODULES = sorted(p for p in TF.glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_every_marked_name_is_a_public_function_or_class_of_its_module(path: Path) -> None:
    missing = sorted(set(marked(path)) - public(path))
    assert not missing, f"{path.name}: RELEASE_DIFFERENCES names {missing}, which it lacks"


@pytest.mark.parametrize("name", WHOLLY)
def test_compat_and_coordination_hold_release_differences_only(name: str) -> None:
    unmarked = sorted(public(TF / name) - set(marked(TF / name)))
    assert not unmarked, f"{name}: public but not in RELEASE_DIFFERENCES: {unmarked}"


def test_every_release_difference_of_slurmtf_tf_is_in_the_table() -> None:
    rows = table_rows()
    assert rows
    assert all(len(r) == 4 for r in rows), [r[:1] for r in rows if len(r) != 4]
    found = [
        f"{path.name} {name}"
        for path in MODULES
        for name in marked(path)
        if not any(f"`slurmtf/tf/{path.name}`" in r[2] and f"`{name}`" in r[2] for r in rows)
    ]
    assert found == [], f"not in docs/TENSORFLOW_VERSIONS.md's table ('handled in'): {found}"


# Public functions of slurmtf/tf/ that look for an attribute (hasattr, getattr with a
# default) without handling a release difference, and why.
NOT_RELEASE_DIFFERENCES = {
    "keras_compat.py is_chief": "a model outside any strategy writes as the chief",
}


def feature_checks(path: Path) -> list[str]:
    """The public functions and classes of ``path`` that look for an attribute."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.FunctionDef | ast.ClassDef) or node.name.startswith("_"):
            continue
        calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
        if any(
            isinstance(c.func, ast.Name)
            and (c.func.id == "hasattr" or (c.func.id == "getattr" and len(c.args) == 3))
            for c in calls
        ):
            found.append(node.name)
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_every_feature_check_of_slurmtf_tf_is_a_marked_release_difference(path: Path) -> None:
    unmarked = [
        name
        for name in feature_checks(path)
        if name not in marked(path) and f"{path.name} {name}" not in NOT_RELEASE_DIFFERENCES
    ]
    assert not unmarked, (
        f"{path.name}: {unmarked} look for an attribute but are not in RELEASE_DIFFERENCES "
        "(add them, and a row to docs/TENSORFLOW_VERSIONS.md's table, or say why not in "
        "NOT_RELEASE_DIFFERENCES)"
    )


def test_an_unmarked_feature_check_is_found(tmp_path: Path) -> None:
    module = tmp_path / "new.py"
    module.write_text(
        "RELEASE_DIFFERENCES = ('marked',)\n"
        "def marked(x):\n    return hasattr(x, 'a')\n"
        "def unmarked(x):\n    return getattr(x, 'b', None)\n"
        "def plain(x):\n    return getattr(x, 'c')\n"
    )
    assert feature_checks(module) == ["marked", "unmarked"]
    assert [n for n in feature_checks(module) if n not in marked(module)] == ["unmarked"]
