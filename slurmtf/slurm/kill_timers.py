"""Whether a cluster's kill timers can drain a healthy node after another node of a job
hangs (docs/FAILURES.md, "A healthy node drained"): a pure check of ``scontrol show
config``'s values and the release.

A task on a healthy node that ends while its step's srun sits on a frozen node leaves its
slurmstepd trying to send the task's exit to that srun: MessageTimeout per try, 6 tries
before 25.11, 5 since, about 3 s of back-off. Before 26.05 a terminate request that
reaches the stepd meanwhile arms the UnkillableStepTimeout timer, which fires KillWait +
UnkillableStepTimeout + 1 s after the requeue and drains the node ``Kill task failed``
when the stepd is still trying.
"""

from __future__ import annotations

from collections.abc import Mapping

from slurmtf.slurm.release import FIVE_TASK_EXIT_TRIES, TERMINATE_MONITOR_CHECKED, SlurmRelease

BACK_OFF_S = 3  # the stepd's back-off between its tries, rounded up (2.3-2.4 s measured)


def exit_message_tries(release: SlurmRelease) -> int:
    """How often slurmstepd sends a task's exit to a srun that does not answer."""
    return 5 if release >= FIVE_TASK_EXIT_TRIES else 6


def _seconds(config: Mapping[str, str], name: str) -> int | None:
    words = config.get(name, "").split()
    return int(words[0]) if words and words[0].isdigit() else None


def drain_risk(release: SlurmRelease, config: Mapping[str, str]) -> str:
    """One line for the site when KillWait + UnkillableStepTimeout + 1 s does not outlast
    the stepd's tries to a frozen srun on this release; "" when it does, when the release
    arms no such timer or when a value is missing."""
    if release >= TERMINATE_MONITOR_CHECKED:
        return ""
    values = [_seconds(config, n) for n in ("KillWait", "UnkillableStepTimeout", "MessageTimeout")]
    if None in values:
        return ""
    kill_wait, unkillable, message = (v or 0 for v in values)
    tries = exit_message_tries(release)
    needed = tries * message + BACK_OFF_S
    if kill_wait + unkillable + 1 > needed:
        return ""
    return (
        f"Slurm {release} can drain a healthy node 'Kill task failed' when another node of a "
        f"job hangs: KillWait ({kill_wait} s) + UnkillableStepTimeout ({unkillable} s) + 1 s "
        f"<= {tries} x MessageTimeout ({message} s) + {BACK_OFF_S} s; HINT: an admin sets "
        f"UnkillableStepTimeout={needed - kill_wait} or more in slurm.conf"
    )
