"""The sbatch job scripts that ship with slurmtf, and writing them into a user's folder.

One copy each: ``jobs/*.sbatch`` in a checkout, reached through the package's
``slurmtf/sbatch/`` (links to them, which the wheel holds as files). Installed without a
checkout, ``slurmtf job-scripts DIR`` writes them where the user submits from.
"""

from __future__ import annotations

import dataclasses
from importlib import resources
from pathlib import Path

from slurmtf.errors import InputError

PACKAGE_DIR = "sbatch"  # slurmtf/sbatch/*.sbatch, package data


@dataclasses.dataclass(frozen=True)
class JobScript:
    """One bundled job script: its file name and text."""

    name: str
    text: str

    @property
    def summary(self) -> str:
        """What it is for: its header's first paragraph, on one line."""
        lines = []
        for line in self.text.splitlines()[1:]:
            words = line.removeprefix("#").strip()
            if not line.startswith("#") or not words:
                break
            lines.append(words)
        return " ".join(lines)


def bundled() -> list[JobScript]:
    """The job scripts of this slurmtf, by name."""
    folder = resources.files("slurmtf") / PACKAGE_DIR
    return sorted(
        (
            JobScript(item.name, item.read_text(encoding="utf-8"))
            for item in folder.iterdir()
            if item.name.endswith(".sbatch")
        ),
        key=lambda script: script.name,
    )


def plan(directory: Path, scripts: list[JobScript], *, force: bool = False) -> list[str]:
    """What writing ``scripts`` into ``directory`` does to each: ``new``, ``same`` (already
    there, identical) or ``replaced`` (``force``). A changed file without ``force`` is
    refused before anything is written."""
    if directory.exists() and not directory.is_dir():
        raise InputError("DIR", str(directory), "is not a folder", "name a folder (created)")
    actions = []
    for script in scripts:
        path = directory / script.name
        if not path.exists():
            actions.append("new")
        elif path.is_file() and path.read_text(encoding="utf-8", errors="replace") == script.text:
            actions.append("same")
        elif force and path.is_file():
            actions.append("replaced")
        else:
            raise InputError(
                "DIR",
                str(directory),
                f"{script.name} there differs from slurmtf's",
                "keep your changes under another name, or add --force to overwrite it "
                "(also when an older slurmtf wrote it)",
            )
    return actions


def write(directory: Path, *, force: bool = False) -> list[tuple[Path, str]]:
    """Write every bundled job script into ``directory`` (created); each path and what
    happened to it (:func:`plan`)."""
    scripts = bundled()
    actions = plan(directory, scripts, force=force)
    directory.mkdir(parents=True, exist_ok=True)
    done = []
    for script, action in zip(scripts, actions, strict=True):
        path = directory / script.name
        if action != "same":
            path.write_text(script.text, encoding="utf-8")
            path.chmod(0o755)
        done.append((path, action))
    return done
