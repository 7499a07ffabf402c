"""Every Slurm call the batch job's own processes make (the supervisor, its keeper and its
watcher), each through the runner with a bound, and the srun lines of slurmtf's own steps
(the training steps' srun is the supervisor's):

* the job's steps: listed, ended (the steps of a hung node, the watcher's step aside, or
  of an earlier supervisor), the job cancelled;
* the job's records (``scontrol show job``), SlurmdTimeout and the kill timers, the minimum of a
  ``--nodes=MIN-MAX`` range, the log folder in its ``Comment``;
* requeueing without nodes (``ExcNodeList``; a node the job asked by name also leaves its
  ``ReqNodeList``), after waiting until Slurm took a hung node out of the job;
* the nodes: a probe of each (a one-task step beside the others), those Slurm reports
  drained or down (``sinfo``);
* the srun lines of slurmtf's own steps: a one-task step on a node (the probe, the
  watcher), one task on every node (staging).
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from slurmtf.cluster.hostlists import expand_hostlist
from slurmtf.errors import SlurmCommandError, SlurmtfError
from slurmtf.slurm.kill_timers import drain_risk
from slurmtf.slurm.node_states import OUT_OF_SERVICE, meetable_exclusion, out_of_service
from slurmtf.slurm.release import SlurmRelease
from slurmtf.slurm.runner import Runner
from slurmtf.slurm.scontrol import parse_records, submit_line_nodes
from slurmtf.spec.noderange import admin_line

TIMEOUT_S = 30.0
STALE_STEPS_S = 60.0  # the wait for an earlier supervisor's steps to leave Slurm's books
UPDATE_S = 20.0  # scontrol update retried while Slurm says "try again"
TERM_GRACE_S = 5.0  # a step's tasks between SIGTERM (they save from memory) and SIGKILL
WATCHER_NAME = "slurmtf-watcher"  # the watcher's step (srun --job-name)
BEACON_NAME = "slurmtf-beacon"  # the nodes' beacon (slurmtf.runtime.job.beacon)


def _ask(runner: Runner, args: Sequence[str], timeout: float = TIMEOUT_S) -> str:
    """A Slurm command's output, "" when it failed."""
    try:
        return runner(list(args), timeout=timeout)
    except (SlurmtfError, OSError):
        return ""


def job_steps(job_id: str, runner: Runner) -> list[tuple[str, str]]:
    """The job's steps (batch and extern aside) as ``(id, name)``."""
    out = _ask(runner, ["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"], 10)
    steps = [[*line.split(), ""][:2] for line in out.splitlines() if line.split()]
    return [(s, name) for s, name in steps if not s.endswith((".batch", ".extern"))]


def end_steps(
    job_id: str,
    runner: Runner,
    *,
    watcher_too: bool = False,
    grace_s: float = TERM_GRACE_S,
    sleep: Callable[[float], None] = time.sleep,
    keep: Sequence[str] = (),
) -> list[str]:
    """End the job's steps (batch and extern aside; the watcher's step too only when
    asked): SIGTERM to their tasks first, so that a rank saves the step it holds from
    memory (slurmtf.training.rescue) and leaves, and after at most ``grace_s`` s, or at
    once when they are gone, ``scancel`` (SIGKILL: a plain scancel of a step sends no
    SIGTERM). The tasks on the healthy nodes end; the step's srun is ended by the
    supervisor (it would wait for the silent node). Steps named in ``keep`` (the next
    attempt's warm ranks on the nodes that remain) go on. The steps ended.

    The signal goes through slurmctld (``--ctld``): scancel with a signal otherwise asks
    each node's slurmd itself and waits its MessageTimeout for a silent one (10 s)."""
    steps = [
        s
        for s, name in job_steps(job_id, runner)
        if (watcher_too or name != WATCHER_NAME) and name not in keep
    ]
    if not steps:
        return steps
    _ask(runner, ["scancel", "--ctld", "--signal=TERM", *steps], 10)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and set(steps) & {s for s, _ in job_steps(job_id, runner)}:
        sleep(0.2)
    _ask(runner, ["scancel", *steps], 10)
    return steps


def end_stale_steps(
    job_id: str, runner: Runner, log: Callable[[str], None], sleep: Callable[[float], None]
) -> None:
    """Before a restarted supervisor's first step: end every step an earlier supervisor of
    this allocation left (its watcher's too) and wait until Slurm lists none, bounded by
    :data:`STALE_STEPS_S` (a step on a silent node stays listed until the node answers)."""
    steps = end_steps(job_id, runner, watcher_too=True)
    if not steps:
        return
    log(f"ending the step(s) {','.join(steps)} the earlier supervisor left")
    deadline = time.monotonic() + STALE_STEPS_S
    while time.monotonic() < deadline and job_steps(job_id, runner):
        sleep(1)


def cancel(job_id: str, runner: Runner) -> None:
    """``scancel`` the job (its watcher, when it may not requeue it)."""
    _ask(runner, ["scancel", job_id], 10)


def job_records(job_id: str, runner: Runner) -> list[dict[str, str]]:
    """``scontrol show job``'s records of this job: one, or one per component of a
    heterogeneous job (records are apart by a blank line; a record's lines are one)."""
    text = _ask(runner, ["scontrol", "show", "job", job_id])
    chunks = [" ".join(chunk.split()) for chunk in text.split("\n\n") if chunk.strip()]
    return [found[0] for found in map(parse_records, chunks) if found]


def job_fields(job_id: str, runner: Runner) -> dict[str, str]:
    """The job's fields (its first component's: the batch host's)."""
    found = job_records(job_id, runner)
    return found[0] if found else {}


def config(runner: Runner) -> dict[str, str]:
    """``scontrol show config`` as name -> value (``KillWait`` -> ``5 sec``); {} when
    Slurm does not answer."""
    pairs = (
        line.partition(" = ") for line in _ask(runner, ["scontrol", "show", "config"]).splitlines()
    )
    return {name.strip(): value.strip() for name, sep, value in pairs if sep and name.strip()}


def slurmd_timeout(runner: Runner) -> int:
    words = config(runner).get("SlurmdTimeout", "").split()
    return int(words[0]) if words and words[0].isdigit() else 300


def kill_timer_line(runner: Runner) -> str:
    """The site's line when its kill timers can drain a healthy node
    (:func:`slurmtf.slurm.kill_timers.drain_risk`), from one ``scontrol show config``."""
    values = config(runner)
    try:
        release = SlurmRelease.parse(values.get("SLURM_VERSION", ""), "SLURM_VERSION")
    except SlurmtfError:
        return ""
    return drain_risk(release, values)


def wait_node_gone(
    job_id: str,
    lost: Sequence[str],
    runner: Runner,
    log: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Before requeueing without a node that hangs: wait until Slurm has taken it out of
    the job (at SlurmdTimeout, under --no-kill). Slurm 22.05 gives a job requeued while
    a hung node still holds its old step no generic resources (every srun of it then
    fails with "Invalid generic resource (gres) specification"). Bounded by
    SlurmdTimeout + 60 s."""
    if not lost:
        return
    timeout = slurmd_timeout(runner)
    log(
        f"waiting for Slurm to take node(s) {','.join(lost)} out of the job (SlurmdTimeout "
        f"{timeout} s) before requeueing"
    )
    deadline = time.monotonic() + timeout + 60
    while time.monotonic() < deadline:
        lists = [r.get("NodeList", "") for r in job_records(job_id, runner)]
        with contextlib.suppress(SlurmtfError):
            if not set(lost) & {n for text in lists if text for n in expand_hostlist(text)}:
                return
        sleep(2)


def requeue(
    job_id: str,
    exclude: Sequence[str],
    runner: Runner,
    log: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """``scontrol requeue`` (it ends the batch script with SIGTERM: the caller ignores
    it first), then the nodes to avoid added to the job's ExcNodeList while its
    partition(s) can still give its node count without them (sinfo), and taken out of the
    nodes it asked by name (``sbatch -w``) with those Slurm has taken out of service:
    else it could never start again. A heterogeneous job's components each keep their
    own lists (:func:`_avoid_in`). Why it then waits, when Slurm says it cannot start."""
    try:
        runner(["scontrol", "requeue", job_id], timeout=TIMEOUT_S)
    except (SlurmtfError, OSError) as exc:
        log(f"scontrol requeue failed: {exc}")
        return False
    records = job_records(job_id, runner) or [{}]
    partitions = ",".join(dict.fromkeys(r["Partition"] for r in records if r.get("Partition")))
    states = partition_states(partitions, runner)
    # A component's ExcNodeList holds the other components' nodes (Slurm's own): not the
    # job's exclusions. Its node count is every component's.
    before = _hosts(records[0].get("ExcNodeList", "")) if len(records) == 1 else []
    needed = sum(_fewest(r.get("NumNodes", "")) for r in records)
    choice = meetable_exclusion(exclude, states, needed, before)
    if choice.line:
        log(choice.line)
    for index, record in enumerate(records):
        target = job_id if index == 0 else record.get("JobId", "")
        _avoid_in(
            target, record, choice.exclude, states=states, index=index,
            het=len(records) > 1, runner=runner, log=log, sleep=sleep,
        )  # fmt: skip
    said = waiting_line(job_id, job_fields(job_id, runner), states)
    if said:
        log(said.strip())
    return True


def _avoid_in(
    target: str,
    record: Mapping[str, str],
    exclude: Sequence[str],
    *,
    states: Mapping[str, str],
    index: int,
    het: bool,
    runner: Runner,
    log: Callable[[str], None],
    sleep: Callable[[float], None],
) -> None:
    """One component's lists: ``exclude`` added to its ExcNodeList, and its ReqNodeList
    without them and the nodes out of service. An update of a heterogeneous job's first
    component (the job's own id) sets every component's ExcNodeList, so the others set
    theirs again after it; and scontrol cannot change that first component's ReqNodeList
    (it refuses a size change of a job of several records): it keeps the nodes it asked,
    and the line says so."""
    whose = "the restarted job" if not het else f"the restarted job's component {index}"
    old, asked = _hosts(record.get("ExcNodeList", "")), _hosts(record.get("ReqNodeList", ""))
    pinned = het and index == 0
    new = [n for n in exclude if not (pinned and n in asked)]
    if new or (het and index > 0):
        avoid = ",".join(dict.fromkeys([*old, *new]))
        _update(target, f"ExcNodeList={avoid}", runner, sleep)
        if new:
            log(f"{whose} avoids node(s) {avoid}")
    dropped = [n for n in asked if n in {*exclude, *out_of_service(states)}]
    if dropped and pinned:
        log(f"{whose} still asks for node(s) {','.join(dropped)} by name (sbatch -w): scontrol "
            "cannot change the first component of a heterogeneous job, so the job waits for "
            "them; HINT: cancel it and submit it without -w on that component")  # fmt: skip
    elif dropped:
        kept = [n for n in asked if n not in dropped]
        _update(target, f"ReqNodeList={','.join(kept)}", runner, sleep)
        log(f"{whose} no longer asks for node(s) {','.join(dropped)}")


def partition_states(partitions: str, runner: Runner) -> dict[str, str]:
    """The nodes of the job's partition(s) (``Partition=a,b``) and their states (sinfo's
    ``%T``); {} when sinfo does not tell."""
    if not partitions or partitions == "(null)":
        return {}
    args = ["sinfo", "--noheader", "--Node", f"--partition={partitions}", "--format=%N %T"]
    out = _ask(runner, args, 10)
    return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)


def waiting_line(job_id: str, fields: Mapping[str, str], states: Mapping[str, str]) -> str:
    """The job's line when Slurm says it cannot start on the nodes it may have."""
    down = {n: states[n] for n in out_of_service(states)}
    return admin_line(job_id, fields, down) or ""


def _hosts(text: str) -> list[str]:
    if not text or text == "(null)":
        return []
    try:
        return expand_hostlist(text)
    except SlurmtfError:
        return []


def _fewest(num_nodes: str) -> int:
    """``NumNodes=2`` or ``2-3``: the fewest nodes the job starts on; 0 when unknown."""
    low = num_nodes.partition("-")[0]
    return int(low) if low.isdigit() else 0


def _update(job_id: str, field: str, runner: Runner, sleep: Callable[[float], None]) -> None:
    """``scontrol update JobId=N FIELD``, again for a while when Slurm says to try again
    (a job that lost a node gets a new record first: "the DB index is being set")."""
    args = ["scontrol", "update", f"JobId={job_id}", field]
    deadline = time.monotonic() + UPDATE_S
    while True:
        try:
            runner(args, timeout=TIMEOUT_S)
            return
        except (SlurmtfError, OSError) as exc:
            if "try again" not in str(exc) or time.monotonic() > deadline:
                return
        sleep(1)


def set_comment(job_id: str, comment: str, runner: Runner) -> None:
    """``scontrol update JobId=N Comment=...`` (the job scripts name their logs there)."""
    _ask(runner, ["scontrol", "update", f"JobId={job_id}", f"Comment={comment}"], 10)


def range_minimum(job_id: str, allocated: int, runner: Runner) -> str:
    """``MIN_NODES`` when the user set none: the minimum of the job's ``--nodes=MIN-MAX``
    range as ``scontrol show job`` shows it (``SubmitLine=``, Slurm 25.11+), when the job
    got more nodes than that; "" when Slurm does not say (22.05 to 25.05: every node the
    job trains on is then its minimum) or the job asked no range."""
    if not job_id or job_id == "local":
        return ""
    records = parse_records(_ask(runner, ["scontrol", "-o", "show", "job", job_id], 15))
    found = submit_line_nodes(records[0].get("SubmitLine", "")) if records else None
    if found is None or not found[0] < allocated:
        return ""
    return str(found[0])


def one_task_step(node: str, group: int | None = None) -> list[str]:
    """srun and its flags for a one-task step on ``node`` (of the heterogeneous job's
    component ``group``) beside the job's other steps (``--overlap``: it asks no resources
    of its own)."""
    het = [f"--het-group={group}"] if group is not None else []
    return ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}", *het]


def per_node_step(nodes: int) -> list[str]:
    """srun and its flags for a step of one task on each of the job's ``nodes`` nodes."""
    return ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1"]


def probe_args(node: str, group: int | None = None) -> list[str]:
    """A one-task step on ``node`` (of the heterogeneous job's component ``group``) that
    does nothing. ``--overlap``: after a node hangs, Slurm keeps the old step on the books
    (it holds the CPUs of every node of the step) until that node answers again, and a
    step without it would wait for them."""
    return [*one_task_step(node, group), "--time=1", "--output=/dev/null", "--error=/dev/null",
            "true"]  # fmt: skip


def left_running(args: Sequence[str], seconds: float) -> list[str]:
    """``args`` (an srun) started by a shell that waits ``seconds`` for it and then exits
    124 (like ``timeout``) but leaves it running, its output to /dev/null: an srun of a
    heterogeneous job's component that dies before its tasks started (SIGKILL at a probe's
    timeout) makes Slurm 26.05 cancel the whole job (measured on the sandbox: a frozen
    node's probe); left alone, it ends with the job's steps."""
    loops = max(int(seconds / 0.2), 1)
    script = (
        f"{shlex.join(args)} >/dev/null 2>&1 & p=$!; for _ in $(seq {loops}); do "
        'kill -0 "$p" 2>/dev/null || { wait "$p"; exit $?; }; sleep 0.2; done; exit 124'
    )
    return ["sh", "-c", script]


def probe_dead(
    nodes: Sequence[str], runner: Runner, timeout: float, group: int | None = None
) -> tuple[str, ...]:
    """The nodes whose slurmd no longer starts a task of this job (dead or frozen), probed
    side by side, each within ``timeout`` seconds (a heterogeneous job's probe is left
    running at the timeout: :func:`left_running`)."""

    def silent(node: str) -> bool:
        args = probe_args(node, group)
        try:
            if group is None:
                runner(args, timeout=timeout)
            else:
                runner(left_running(args, timeout), timeout=timeout + 10)
        except SlurmCommandError:
            return True
        return False

    if not nodes:
        return ()
    with ThreadPoolExecutor(max_workers=min(len(nodes), 8)) as pool:
        answers = list(pool.map(silent, nodes))
    return tuple(node for node, dead in zip(nodes, answers, strict=True) if dead)


def drained_nodes(nodes: Sequence[str], runner: Runner) -> tuple[str, ...]:
    """Those of ``nodes`` that Slurm reports drained, draining, down or failing (an
    administrator or a health check took them out of service); none when sinfo cannot
    tell."""
    if not nodes:
        return ()
    args = ["sinfo", "--noheader", "--Node", f"--nodes={','.join(nodes)}", "--format=%N %T"]
    try:
        out = runner(args, timeout=10)
    except SlurmCommandError:
        return ()
    states = dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)
    return tuple(n for n in nodes if states.get(n, "").startswith(OUT_OF_SERVICE))
