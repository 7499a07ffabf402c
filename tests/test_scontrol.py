"""``scontrol -o`` records: slurmtf.slurm.scontrol.parse_records, the one parser (status, sweeps,
the firewall's prolog, benchmarks)."""

from __future__ import annotations

import pytest

from slurmtf.slurm.scontrol import parse_records


@pytest.mark.parametrize(
    ("text", "records"),
    [
        ("", []),
        ("\n\n", []),
        ("JobId=7 JobState=RUNNING\n", [{"JobId": "7", "JobState": "RUNNING"}]),
        ("JobId=7 Comment=slurmtf:/a=b x Reason=None",
         [{"JobId": "7", "Comment": "slurmtf:/a=b", "Reason": "None"}]),
        ("JobId=8 ArrayTaskId=0 NodeList=node[1-2]\nJobId=9 ArrayTaskId=1 NodeList=(null)\n",
         [{"JobId": "8", "ArrayTaskId": "0", "NodeList": "node[1-2]"},
          {"JobId": "9", "ArrayTaskId": "1", "NodeList": "(null)"}]),
        ("no such job\nJobId=3 ExitCode=0:0 Empty=\n",
         [{"JobId": "3", "ExitCode": "0:0", "Empty": ""}]),
    ],
)  # fmt: skip
def test_one_record_a_line_of_key_value_words(text: str, records: list[dict[str, str]]) -> None:
    assert parse_records(text) == records
