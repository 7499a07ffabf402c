"""slurmtf/slurm/kill_timers.py: when KillWait + UnkillableStepTimeout + 1 s does not
outlast slurmstepd's tries to a frozen srun (6 x MessageTimeout + 3 s before 25.11, 5 x
since), a release before 26.05 can drain a healthy node; the line says what to set."""

from __future__ import annotations

import pytest

from slurmtf.slurm.kill_timers import drain_risk, exit_message_tries
from slurmtf.slurm.release import SlurmRelease


def conf(kill_wait: int, unkillable: int, message: int) -> dict[str, str]:
    return {"KillWait": f"{kill_wait} sec", "UnkillableStepTimeout": f"{unkillable} sec",
            "MessageTimeout": f"{message} sec"}  # fmt: skip


@pytest.mark.parametrize(
    ("release", "values", "needed"),
    [
        ("22.05.8", conf(5, 60, 10), None),  # the sandbox: 66 s > 63 s
        ("22.05.8", conf(30, 60, 10), None),  # Slurm's defaults
        ("22.05.8", conf(0, 62, 10), 63),  # 63 s <= 63 s: just too short
        ("22.05.8", conf(5, 60, 30), 178),  # a slow network's MessageTimeout
        ("25.05.3", conf(5, 60, 30), 178),
        ("25.11.7", conf(5, 60, 30), 148),  # 5 tries
        ("25.11.7", conf(5, 50, 10), None),  # 56 s > 53 s
        ("26.05.3", conf(5, 60, 30), None),  # arms no timer after the tasks ended
        ("22.05.8", {"KillWait": "5 sec"}, None),  # Slurm did not say
    ],
)
def test_drain_risk(release: str, values: dict[str, str], needed: int | None) -> None:
    line = drain_risk(SlurmRelease.parse(release), values)
    if needed is None:
        assert line == ""
    else:
        assert line.startswith(f"Slurm {release} can drain a healthy node 'Kill task failed'")
        assert line.endswith(f"HINT: an admin sets UnkillableStepTimeout={needed} or more in "
                             "slurm.conf")  # fmt: skip


def test_exit_message_tries() -> None:
    assert exit_message_tries(SlurmRelease(22, 5, 8)) == 6
    assert exit_message_tries(SlurmRelease(25, 5, 3)) == 6
    assert exit_message_tries(SlurmRelease(25, 11, 0)) == 5
