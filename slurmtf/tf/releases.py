"""The TensorFlow releases slurmtf is tested on, and what a site's module of each carries.

Pure values, no TensorFlow import: ``scripts/tf-venv.sh`` reads the pins of a release
(``python3 -m slurmtf.tf.releases pins 2.16.2``) to build its test environment, and
``slurmtf.tf.install`` compares the installed distribution's version with the tested
range before TensorFlow is imported (docs/TENSORFLOW_VERSIONS.md). What differs between
these releases is detected by feature in ``slurmtf.tf.compat``, never by version.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from slurmtf.errors import SlurmtfError

# ml_dtypes 0.7.0 spends 0.6 s of CPU in its import (0.6.0: 8 ms), in every rank's start;
# pyproject's cpu and gpu extras name the same requirement.
SLOW_ML_DTYPES = "ml_dtypes!=0.7.0"


@dataclass(frozen=True)
class Release:
    """One TensorFlow release as a site's module or container would carry it."""

    tensorflow: str  # newest patch: 2.16.2
    keras: str  # the Keras of its time (a module built then would carry it)
    tf_keras: str  # Keras 2 for tf.keras code (TF_USE_LEGACY_KERAS=1); 2.15's own tf.keras
    numpy: str  # the numpy it runs with (below 2 up to 2.17)

    @property
    def series(self) -> str:
        return ".".join(self.tensorflow.split(".")[:2])

    @property
    def numbers(self) -> tuple[int, int]:
        """``(2, 16)``: the series as numbers, to place another version against it."""
        major, minor = self.tensorflow.split(".")[:2]
        return int(major), int(minor)

    def requirements(self) -> list[str]:
        """pip requirements of a test environment of this release (tf-keras apart: it is
        installed without dependencies, or pip would pull the full ``tensorflow`` wheel)."""
        return [
            f"tensorflow-cpu=={self.tensorflow}", f"keras=={self.keras}", self.numpy, SLOW_ML_DTYPES
        ]  # fmt: skip


# Oldest first. Keras: the release current when the TensorFlow release came out.
RELEASES = (
    Release("2.15.1", "2.15.0", "2.15.1", "numpy<2"),
    Release("2.16.2", "3.3.3", "2.16.0", "numpy<2"),
    Release("2.17.1", "3.5.0", "2.17.0", "numpy<2"),
    Release("2.18.1", "3.8.0", "2.18.0", "numpy"),
    Release("2.19.1", "3.9.2", "2.19.0", "numpy"),
    Release("2.20.0", "3.11.3", "2.20.1", "numpy"),
    Release("2.21.0", "3.15.1", "2.21.0", "numpy"),
)
OLDEST = RELEASES[0]
NEWEST = RELEASES[-1]
TESTED_RANGE = f"{OLDEST.series} to {NEWEST.series}"

_NUMBERS = re.compile(r"^(\d+)\.(\d+)")


def release(version: str) -> Release:
    """The tested release of ``version`` (``2.16``, ``2.16.2``), or an error naming the list."""
    for candidate in RELEASES:
        if version in (candidate.tensorflow, candidate.series):
            return candidate
    known = ", ".join(r.tensorflow for r in RELEASES)
    raise SlurmtfError(
        f"TensorFlow {version!r} is not a tested release. HINT: one of {known} "
        f"(or its series, e.g. {NEWEST.series})"
    )


def series_of(version: str) -> tuple[int, int] | None:
    """``(2, 16)`` of ``2.16.2``/``2.16.0rc1``; None for a string that names no release."""
    match = _NUMBERS.match(version.strip())
    return (int(match[1]), int(match[2])) if match else None


def outside(version: str) -> str | None:
    """``"older"`` or ``"newer"`` for a version outside the tested range, else None (also
    for a string that names no release)."""
    found = series_of(version)
    if found is None:
        return None
    if found < OLDEST.numbers:
        return "older"
    if found > NEWEST.numbers:
        return "newer"
    return None


def main(argv: list[str] | None = None) -> int:
    """``pins VERSION``: the pip requirements of a release's test environment, one a line
    (tf-keras last, for an install without dependencies); ``list``: every tested release."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["list"]:
        print("\n".join(r.tensorflow for r in RELEASES))
        return 0
    if len(args) == 2 and args[0] == "pins":
        try:
            chosen = release(args[1])
        except SlurmtfError as exc:
            print(f"slurmtf.tf.releases: {exc}", file=sys.stderr)
            return 2
        print("\n".join([*chosen.requirements(), f"tf-keras=={chosen.tf_keras}"]))
        return 0
    print("usage: python -m slurmtf.tf.releases pins VERSION | list", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
