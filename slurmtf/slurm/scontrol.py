"""``scontrol -o`` output: one record a line, ``Key=Value`` words (the one parser).

What differs between releases, and how it is read here:

* From Slurm 25.11 ``scontrol show job`` prints ``SubmitLine=`` (the command line the job
  was submitted with, words separated by spaces, unquoted) just before ``WorkDir=``: its
  value runs up to ``WorkDir=``, so that the submitted arguments (``--nodes=2-3``, a
  script's ``key=value`` arguments) never pass for fields. :func:`submit_line_nodes`
  reads a ``--nodes=MIN-MAX`` range from it: the only place a running job's range minimum
  shows (22.05 prints only ``NumNodes``).
* 26.05 prints a job's ``NodeList`` sorted and may add ``FailedNode=NODE``: a node list
  read here is a set of names, never the order of the step's ranks (that comes from the
  step's own variables, :mod:`slurmtf.cluster.env`).

Standard library only: the per-job firewall imports it in slurmd's prolog.
"""

from __future__ import annotations

# A field whose value may hold spaces -> the field that always follows it.
_SPANS = {"SubmitLine": "WorkDir"}


def parse_records(text: str) -> list[dict[str, str]]:
    """``scontrol -o show job|node ...`` output -> one dict per record (line); the words
    without ``=`` are left out, a value keeps any ``=`` after the first, and a
    ``SubmitLine=`` value keeps its words up to ``WorkDir=``."""
    records = []
    for line in text.splitlines():
        fields: dict[str, str] = {}
        spanning = ""
        for word in line.split():
            if spanning and not word.startswith(f"{_SPANS[spanning]}="):
                fields[spanning] += f" {word}"
                continue
            spanning = ""
            if "=" not in word:
                continue
            key, value = word.split("=", 1)
            fields[key] = value
            spanning = key if key in _SPANS else ""
        if fields:
            records.append(fields)
    return records


def submit_line_nodes(submit_line: str) -> tuple[int, int] | None:
    """The ``--nodes`` / ``-N`` count or ``MIN-MAX`` range of an ``sbatch`` command line as
    ``SubmitLine=`` shows it, up to the job script (a word ending in ``.sbatch`` or
    ``.sh``) or ``--wrap``: ``(2, 3)`` for ``--nodes=2-3``, ``(2, 2)`` for ``-N 2``;
    ``None`` when the line names no node count (the script's ``#SBATCH`` lines are not in
    it) or one that is not a count."""
    words = submit_line.split()
    found: str | None = None
    for i, word in enumerate(words[1:], start=1):
        if word.endswith((".sbatch", ".sh")) or word.startswith("--wrap"):
            break
        if word.startswith("--nodes="):
            found = word.removeprefix("--nodes=")
        elif word in ("--nodes", "-N") and i + 1 < len(words):
            found = words[i + 1]
        elif word.startswith("-N") and len(word) > 2:
            found = word[2:]
    return _node_range(found) if found is not None else None


def _node_range(text: str) -> tuple[int, int] | None:
    low, _, high = text.partition("-")
    high = high or low
    if not (low.isdigit() and high.isdigit()) or not 0 < int(low) <= int(high):
        return None
    return int(low), int(high)
