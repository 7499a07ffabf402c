"""Bash's own syntax check for user shell lines (``--setup``), without running them."""

from __future__ import annotations

import shutil
import subprocess


def syntax_problem(line: str) -> str | None:
    """Why ``line`` is not one complete bash command on its own, or None if it is.

    ``bash -n`` parses without executing. A line that opens a block (``if``, ``{``,
    ``for ... do``), ends with an operator (``&&``, ``|``) or starts a here-document
    would swallow the lines after it in a job script; bash reports each of these (the
    here-document as a warning, which counts here too). Without bash, None.
    """
    bash = shutil.which("bash")
    if bash is None:
        return None
    result = subprocess.run(
        [bash, "--norc", "--noprofile", "-n", "-c", line],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=10,
        check=False,
    )
    if result.returncode == 0 and not result.stderr.strip():
        return None
    message = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "rejected"
    return message.removeprefix(f"{bash}: ").removeprefix("bash: ")
