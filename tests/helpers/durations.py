"""Where the suite's time goes: per-module seconds from pytest's ``--durations=0`` lines.

``python3 -m tests.helpers.durations LOG [LOG ...]`` reads the ``--durations=0`` output of
whole runs (``SLURMTF_TEST_DURATIONS=0 bash scripts/test.sh``; the version matrix's part
of the log, which follows the suite's, is left out), writes each module's seconds
(setup + call + teardown of its tests) to :data:`SECONDS_FILE`, and prints the table of
docs/TESTING.md. With several logs a module's figure is its largest.

The suite's order on pytest-xdist workers follows that file (:func:`longest_first`): the
longest modules start first, so that no long module starts last on one worker while the
other waits (each worker takes a module when its last is nearly done).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

SECONDS_FILE = Path(__file__).resolve().parents[1] / "module_seconds.json"
DURATION = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S+?\.py)(?:::\S*)?\s*$")
SUITE_END = re.compile(r"^=+ .*\b(passed|failed|error)s?\b.* in [\d.]+s")
UNKNOWN_S = 1.0  # a module no run has measured yet: after every measured long one


def module_seconds(lines: Iterable[str]) -> dict[str, float]:
    """Each module's seconds in the first run of ``lines`` (up to its closing line)."""
    seconds: dict[str, float] = {}
    for line in lines:
        if SUITE_END.match(line.strip()):
            break
        found = DURATION.match(line.strip())
        if found:
            module = found.group(3)
            seconds[module] = round(seconds.get(module, 0.0) + float(found.group(1)), 2)
    return seconds


def merged(runs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each module's largest figure over ``runs``, longest first."""
    out: dict[str, float] = {}
    for run in runs:
        for module, seconds in run.items():
            out[module] = max(out.get(module, 0.0), seconds)
    return dict(sorted(out.items(), key=lambda item: (-item[1], item[0])))


def longest_first(modules: Sequence[str], seconds: Mapping[str, float]) -> list[str]:
    """``modules`` (paths relative to the checkout) with the longest recorded first; the
    unmeasured (:data:`UNKNOWN_S`) and ties keep their order."""
    ranked = sorted(enumerate(modules), key=lambda m: (-seconds.get(m[1], UNKNOWN_S), m[0]))
    return [module for _, module in ranked]


def read_seconds(path: Path = SECONDS_FILE) -> dict[str, float]:
    """The recorded figures ({} without a readable file)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def table(seconds: Mapping[str, float], top: int = 30) -> str:
    """The markdown table of the ``top`` longest modules, then the rest summed."""
    rows = list(seconds.items())
    total = sum(seconds.values())
    lines = ["| module | seconds | share |", "| --- | ---: | ---: |"]
    lines += [f"| `{m}` | {s:.0f} | {s / total:.1%} |" for m, s in rows[:top]]
    rest = sum(s for _, s in rows[top:])
    if rows[top:]:
        lines.append(f"| {len(rows) - top} other modules | {rest:.0f} | {rest / total:.1%} |")
    lines.append(f"| **all {len(rows)} modules** | **{total:.0f}** | |")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("usage: python3 -m tests.helpers.durations LOG [LOG ...]", file=sys.stderr)
        return 2
    runs = [module_seconds(Path(log).read_text(errors="replace").splitlines()) for log in argv]
    if not any(runs):
        print(f"no --durations=0 lines in {', '.join(argv)}: run the suite with "
              "SLURMTF_TEST_DURATIONS=0", file=sys.stderr)  # fmt: skip
        return 1
    seconds = merged(runs)
    SECONDS_FILE.write_text(json.dumps(seconds, indent=1) + "\n")
    print(table(seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
