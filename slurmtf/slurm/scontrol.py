"""``scontrol -o`` output: one record a line, ``Key=Value`` words (the one parser).

Standard library only: the per-job firewall imports it in slurmd's prolog.
"""

from __future__ import annotations


def parse_records(text: str) -> list[dict[str, str]]:
    """``scontrol -o show job|node ...`` output -> one dict per record (line); the words
    without ``=`` are left out, a value keeps any ``=`` after the first."""
    records = []
    for line in text.splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if fields:
            records.append(fields)
    return records
