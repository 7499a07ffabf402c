"""The package's layout: old module names still import, a job pickled by an earlier
layout still loads, docs/ARCHITECTURE.md's diagram shows every top-level entry, and each
package's docstring lists its modules, one line each, and every code name its concept
table gives is in the code."""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest
from submitit.core.utils import DelayedSubmission

import slurmtf
from slurmtf.launch import TaskLauncher
from slurmtf.spec.jobspec import JobSpec, task_command
from tests.helpers import doc_names, module_lists

ROOT = Path(__file__).resolve().parents[1]
# submitit job files (a DelayedSubmission of TaskLauncher) pickled by earlier layouts:
# slurmtf 0.1.0 (the class as slurmtf.launch.TaskLauncher) and the flat runtime package
# (slurmtf.runtime.launcher.TaskLauncher) -> the grid point each holds.
PICKLED = {
    "launcher-0.1.0.pkl": {},
    "launcher-runtime.pkl": {"lr": "0.1"},
}


def imports_tensorflow(module: str) -> bool:
    """Whether ``module``'s source imports TensorFlow as it loads (a line at its top)."""
    source = ROOT.joinpath(*module.split(".")).with_suffix(".py").read_text()
    return re.search(r"^(import|from) tensorflow\b", source, re.M) is not None


@pytest.mark.parametrize(
    "old",
    [
        pytest.param(old, marks=[pytest.mark.tf] if imports_tensorflow(new) else [])
        for old, new in sorted(slurmtf.MOVED_MODULES.items())
    ],
)
def test_an_old_module_name_imports_the_module_that_holds_it_now(old: str) -> None:
    new = slurmtf.MOVED_MODULES[old]
    with pytest.warns(DeprecationWarning, match=re.escape(f"{old} is now {new}")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__name__ == new
    assert module.__spec__ is not None
    assert module.__spec__.name == new


def test_the_former_recovery_module_names_resolve_in_its_package() -> None:
    """``slurmtf.runtime.recovery`` was a module; it is a package now (its body is
    ``decision``), and its names still resolve there."""
    from slurmtf.runtime.recovery import decision

    with pytest.warns(DeprecationWarning, match="recovery.decide is now .*recovery.decision"):
        from slurmtf.runtime.recovery import decide
    assert decide is decision.decide
    with pytest.raises(ImportError):
        from slurmtf.runtime.recovery import no_such_name  # noqa: F401


@pytest.mark.parametrize("name", sorted(PICKLED))
def test_a_job_pickled_before_the_layout_change_still_loads(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # an old module name, if moved
        submission = DelayedSubmission.load(ROOT / "tests" / "data" / "pickled" / name)
    launcher = submission.function
    assert isinstance(launcher, TaskLauncher)
    assert launcher.params == PICKLED[name]
    spec = JobSpec.from_json(launcher.spec_json)
    assert (spec.kind, spec.target, spec.nodes, spec.args) == (
        "model",
        "mnist",
        2,
        ("--train_steps=20",),
    )
    command = task_command(spec, launcher.params, "python3", job_id="42")
    assert "--train_steps=20" in command


def top_level_entries() -> set[str]:
    package = ROOT / "slurmtf"
    names = {p.stem if p.suffix == ".py" else p.name for p in package.iterdir()}
    return {n for n in names if not n.startswith((".", "__")) and n != "py.typed"}


def test_the_top_level_holds_at_most_twelve_modules() -> None:
    modules = list((ROOT / "slurmtf").glob("*.py"))
    assert len(modules) <= 12, sorted(p.name for p in modules)


def test_the_architecture_diagram_shows_every_top_level_entry() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    diagram = text[text.index("```mermaid") : text.index("```", text.index("```mermaid") + 3)]
    missing = sorted(n for n in top_level_entries() if not re.search(rf"\b{n}\b", diagram))
    assert not missing, f"not in docs/ARCHITECTURE.md's diagram: {missing}"


def test_every_subpackage_says_what_lives_there_and_what_it_may_import() -> None:
    for init in sorted((ROOT / "slurmtf").glob("*/__init__.py")):
        doc = importlib.import_module(f"slurmtf.{init.parent.name}").__doc__ or ""
        assert "May import" in doc, f"{init}: the docstring names no allowed imports"


def packages() -> list[Path]:
    """Every package under slurmtf/ (the top level's entries are the diagram's, above)."""
    return sorted(
        p.parent for p in (ROOT / "slurmtf").rglob("__init__.py") if p.parent.parent != ROOT
    )


def listed(package: Path) -> list[str]:
    """The names a package's docstring lists, one line each: ``- ``name``: what it holds``."""
    dotted = ".".join(package.relative_to(ROOT).parts)
    return [name for name, _ in module_lists.listed(dotted)]


@pytest.mark.parametrize("package", packages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_package_lists_each_of_its_modules_once(package: Path) -> None:
    modules = {p.stem for p in package.glob("*.py") if not p.name.startswith("__")}
    modules |= {p.parent.name for p in package.glob("*/__init__.py")}
    names = listed(package)
    assert len(names) == len(set(names)), f"{package.name}: listed twice: {names}"
    assert set(names) >= modules, (
        f"{package.name}: not in its docstring: {sorted(modules - set(names))}"
    )
    assert set(names) <= modules, f"{package.name}: no such module: {sorted(set(names) - modules)}"


def test_the_architecture_module_tables_are_the_package_docstrings_lists() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    assert module_lists.current(text) == module_lists.render(), (
        "docs/ARCHITECTURE.md's module tables differ from the package docstrings: "
        "run python3 -m tests.helpers.module_lists"
    )


def concept_table(home: str) -> str:
    """A concept table of one row whose home column is ``home``."""
    return (
        "## Where each concept lives\n| concept | home | used by |\n| --- | --- | --- |\n"
        f"| x | {home} | y |\n"
    )


def test_every_name_of_the_architecture_concept_table_is_in_the_code() -> None:
    stale = doc_names.stale_names()
    assert not stale, f"docs/ARCHITECTURE.md names what the code does not have: {stale}"


@pytest.mark.parametrize(
    ("home", "stale"),
    [
        ("`slurmtf/cli/__init__.py` `underscore_flags`", "cli/__init__.py: underscore_flags"),
        ("`slurmtf/runtime/recovery/node_choice.py` (`Nodes` (`kills`))", "choice.py: kills"),
        ("`slurmtf/runtime/job/` `supervisor.py` (`Supervisor.gone`)", "Supervisor.gone"),
        ("`slurmtf/job.sh` `slurmtf_resv_args`", "slurmtf/job.sh: slurmtf_resv_args"),
        ("`slurmtf/nowhere.py` `x`", "no such file: slurmtf/nowhere.py"),
        ("`slurmtf/spec/values.py` `JobSpec.gird`", "values.py: JobSpec.gird"),
    ],
)
def test_a_stale_name_of_the_concept_table_is_found(home: str, stale: str) -> None:
    found = doc_names.stale_names(concept_table(home))
    assert len(found) == 1, found
    assert found[0].endswith(stale)


def test_names_the_code_has_pass_the_concept_table_check() -> None:
    home = (
        "`slurmtf/runtime/job/` `supervisor.py` (`Supervisor`), `slurmtf/spec/values.py` "
        "`JobSpec.grid`, `after_step.decide_and_record`, `SLURMTF_HEARTBEAT_S`, `recovery`"
    )
    assert doc_names.stale_names(concept_table(home)) == []
