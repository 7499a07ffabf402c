"""Hostile strings through the sbatch renderer: nothing injected ever runs.

Job names, log folders, partitions, accounts, constraints, extra sbatch values, the
Python path and setup lines are drawn from shell metacharacters and payloads that would
create a canary file if any shell evaluated them. For each spec the renderer accepts:

* ``bash -n`` parses the rendered script;
* every ``#SBATCH`` line is one ``--key=value`` word for ``shlex`` with the value intact;
* the hand-over to the supervisor (``srun() { exec PYTHON -m slurmtf job submitit ...``)
  names the Python path intact, as one word;
* the script is RUN by bash without that line, with ``srun`` and ``module`` replaced by
  recorders: srun is reached, receives exactly the argv slurmtf meant (log paths and
  folder byte for byte), and no canary file appears.

A spec the renderer refuses must fail with ``InputError`` naming the flag, with a HINT.
``SLURMTF_FUZZ_SBATCH_EXAMPLES`` sets the count (default 300; a few seconds).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from slurmtf.errors import InputError
from slurmtf.spec import jobspec
from slurmtf.spec import values as jobvalues

EXAMPLES = int(os.environ.get("SLURMTF_FUZZ_SBATCH_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
    # The explain phase imports modules that warn on import, which pytest turns into errors.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)

WORK = Path(tempfile.mkdtemp(prefix="slurmtf-sbatch-fuzz-"))
CANARY = WORK / "canary"
BIN = WORK / "bin"
RECORD = WORK / "srun.json"

_RECORDER = f"""#!/usr/bin/env python3
import json, sys
with open({str(RECORD)!r}, "w") as f:
    json.dump(sys.argv[1:], f)
"""
_MODULE = "#!/bin/sh\nexit 0\n"
HAND_OVER = "srun() { exec "  # the setup line that hands submitit's srun to the supervisor


def _shims() -> None:
    BIN.mkdir(exist_ok=True)
    for name, text in (("srun", _RECORDER), ("module", _MODULE)):
        path = BIN / name
        if not path.exists():
            path.write_text(text)
            path.chmod(0o755)


PAYLOADS = [
    f"$(touch {CANARY})",
    f"`touch {CANARY}`",
    f"; touch {CANARY}",
    f"' ; touch {CANARY} ; '",
    f'" ; touch {CANARY} ; "',
    f"&& touch {CANARY}",
    f"| touch {CANARY}",
    f"> {CANARY}",
    f"$(touch {CANARY})'\"",
    f"${{IFS}}touch${{IFS}}{CANARY}",
    f"\\'$(touch {CANARY})",
    f"x' $(touch {CANARY}) 'y",
    f"#'\n touch {CANARY}",
    f"a\rtouch {CANARY}",
    "$HOME",
    "~root",
    "*",
    "%j %t",
    "a b",
    "'",
    '"',
    "\\",
    "é ünïcode",
    "",
]
_PIECE = st.sampled_from(PAYLOADS) | st.text(
    alphabet=st.sampled_from(list("ab ;|&$`'\"\\(){}<>*?~#!%=,-_/.\t")), max_size=10
)
_HOSTILE = st.lists(_PIECE, min_size=1, max_size=3).map("".join)
_NAME = st.one_of(st.sampled_from(["train", "mnist-2n"]), _HOSTILE)
_OPTIONAL = st.none() | _HOSTILE
# Setup lines are shell code on purpose (``module load``); they must not be able to
# swallow or unbalance the srun line that follows them.
SETUP_LINES = [
    "module load tensorflow",
    "source /dev/null",
    "export A='x y'",
    "echo ok # comment",
    "echo 'unbalanced",
    "echo ok &&",
    "echo ok |",
]
# Each of these would swallow the srun line (here-document) or make the whole script a
# syntax error: check_setup_with_bash must refuse them.
SETUP_LINES_OPEN = [
    "cat <<EOF",
    "cat <<'EOF'",
    "if true; then",
    "{",
    "(",
    "case x in",
    "for i in 1; do",
]
# sys.executable in practice: a virtual environment may live under a path with blanks.
PYTHONS = [
    pytest.param("/usr/bin/python3", id="plain"),
    pytest.param(str(WORK / "my env" / "python"), id="blank"),
    pytest.param(str(WORK / "it's" / "python"), id="quote"),
]


@st.composite
def specs(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    fields: dict[str, Any] = {
        "kind": "model",
        "target": "mnist",
        "job_name": draw(_NAME),
        "log_dir": str(WORK / "logs" / draw(_NAME)),
        "partition": draw(_OPTIONAL),
        "account": draw(_OPTIONAL),
        "qos": draw(_OPTIONAL),
        "constraint": draw(_OPTIONAL),
        "sbatch_extra": tuple(
            (key, draw(_HOSTILE))
            for key in draw(st.sets(st.sampled_from(["comment", "mail-user"])))
        ),
        "args": tuple(draw(st.lists(_HOSTILE, max_size=2))),
        "nodes": draw(st.integers(1, 3)),
        "gpus_per_node": draw(st.integers(0, 2)),
    }
    # sys.executable in practice: a virtual environment may live under a path with blanks.
    return fields, "/usr/bin/python3"


def _check_sbatch_lines(script: str) -> None:
    for line in script.splitlines():
        if not line.startswith("#SBATCH"):
            continue
        words = shlex.split(line[len("#SBATCH") :])
        assert len(words) == 1, line
        assert words[0].startswith("--"), line


def _run(script: str) -> subprocess.CompletedProcess[str]:
    path = WORK / "job.sh"
    path.write_text(script)
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(WORK), "LC_ALL": "C.UTF-8"}
    return subprocess.run(
        ["bash", str(path)],
        cwd=WORK,
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def check_rendering(fields: dict[str, Any], python: str) -> None:
    """Render ``fields``; if accepted, parse and run the script as described above."""
    _shims()
    try:
        jobvalues.check_setup_with_bash(fields.get("setup", ()))  # as `slurmtf submit` does
        spec = jobspec.JobSpec(**fields)
        script = jobspec.render_sbatch(spec, python)
    except InputError as exc:
        message = str(exc)
        assert "HINT:" in message
        assert re.match(r"^[-\w/ ]+=", message), f"no flag named in: {message}"
        return
    RECORD.unlink(missing_ok=True)
    CANARY.unlink(missing_ok=True)
    parsed = subprocess.run(
        ["bash", "-n"], input=script, capture_output=True, text=True, timeout=20, check=False
    )
    assert parsed.returncode == 0, f"bash -n: {parsed.stderr}\n{script}"
    _check_sbatch_lines(script)
    handed = [line for line in script.splitlines() if line.startswith(HAND_OVER)]
    if spec.max_requeues:  # the supervisor runs with the same interpreter, one word
        (line,) = handed
        words = shlex.split(line.removeprefix(HAND_OVER).removesuffix(' "$@"; }'))
        assert words[:5] == [python, "-m", "slurmtf", "job", "submitit"], f"{words}\n{script}"
    # Run without the hand-over: submitit's srun line reaches the recording srun as is.
    result = _run("\n".join(x for x in script.splitlines() if x not in handed) + "\n")
    assert not CANARY.exists(), f"an injected command ran:\n{script}"
    assert RECORD.exists(), f"srun was never reached:\n{script}\n{result.stderr}"
    argv = json.loads(RECORD.read_text())
    folder = str(spec.folder)
    assert argv[:2] == ["--unbuffered", "--output"], argv
    assert argv[2] == f"{folder}/%j_%t_log.out", argv
    assert argv[-4:] == ["-u", "-m", "submitit.core._submit", folder], argv
    assert argv[-5] == python, f"python path split or changed: {argv}\n{script}"


@pytest.mark.slow
@FUZZ
@given(case=specs())
def test_hostile_strings_never_run_in_the_sbatch_script(case: tuple[dict[str, Any], str]) -> None:
    check_rendering(*case)


@pytest.mark.parametrize(
    "line",
    [
        *(pytest.param(line, id=f"ok{i}") for i, line in enumerate(SETUP_LINES)),
        *(pytest.param(line, id=f"open{i}") for i, line in enumerate(SETUP_LINES_OPEN)),
    ],
)
def test_a_setup_line_cannot_swallow_the_srun_line(line: str) -> None:
    fields = {"kind": "model", "target": "mnist", "setup": (line, "echo after")}
    check_rendering(fields, "/usr/bin/python3")


@pytest.mark.parametrize("line", SETUP_LINES_OPEN)
def test_a_setup_line_that_opens_a_block_is_refused_naming_it(line: str) -> None:
    with pytest.raises(InputError) as info:
        jobvalues.check_setup_with_bash((line,))
    assert str(info.value).startswith(f"--setup={line!r}"), info.value


@pytest.mark.parametrize("python", PYTHONS)
def test_the_python_path_reaches_srun_intact(python: str) -> None:
    check_rendering({"kind": "model", "target": "mnist", "log_dir": str(WORK / "logs")}, python)
