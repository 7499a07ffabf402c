"""Slurm releases as their commands name them, and what each release does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from slurmtf.errors import InputError, SlurmCommandError
from slurmtf.slurm import release as r
from slurmtf.slurm.release import SlurmRelease


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("slurm 26.05.3\n", SlurmRelease(26, 5, 3)),
        ("slurm-wlm 22.05.8", SlurmRelease(22, 5, 8)),
        ("slurm 25.11.7", SlurmRelease(25, 11, 7)),
        ("25.11.0-0rc1", SlurmRelease(25, 11, 0)),
        ("slurm 24.11.5-1ubuntu1", SlurmRelease(24, 11, 5)),
    ],
)
def test_versions_as_the_commands_print_them(text: str, expected: SlurmRelease) -> None:
    assert SlurmRelease.parse(text) == expected


@pytest.mark.parametrize("text", ["", "slurm", "slurm 2.6", "sinfo: command not found"])
def test_text_without_a_release_is_an_error_naming_it(text: str) -> None:
    with pytest.raises(InputError, match=r"names no Slurm release YY\.MM\.N\. HINT: pass"):
        SlurmRelease.parse(text)


def test_releases_order_by_age_and_print_as_slurm_does() -> None:
    releases = [SlurmRelease.parse(t) for t in ("26.05.3", "22.05.8", "25.11.7", "23.11.10")]
    assert [str(x) for x in sorted(releases)] == ["22.05.8", "23.11.10", "25.11.7", "26.05.3"]
    assert SlurmRelease(26, 5, 3).series == "26.05"
    assert r.DEBIAN_12 < SlurmRelease(23, 11, 10) < r.CGROUP_PLUGIN_DISABLED


class _Runner:
    def __init__(self, out: str = "", fail: bool = False) -> None:
        self.out, self.fail, self.calls = out, fail, []  # type: ignore[var-annotated]

    def __call__(
        self,
        args: Sequence[str],
        *,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        check: bool = True,
    ) -> str:
        self.calls.append(list(args))
        if self.fail:
            raise SlurmCommandError(" ".join(args), 127, f"{args[0]}: command not found")
        return self.out


def test_installed_release_asks_the_named_command() -> None:
    runner = _Runner("slurm 26.05.3\n")
    assert r.installed_release(runner, "/opt/slurm-26.05.3/bin/sinfo") == SlurmRelease(26, 5, 3)
    assert runner.calls == [["/opt/slurm-26.05.3/bin/sinfo", "-V"]]
    with pytest.raises(SlurmCommandError, match="command not found"):
        r.installed_release(_Runner(fail=True))
