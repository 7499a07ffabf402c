"""Soak: a bundled model as a real sandbox job for N minutes, every rank sampled from /proc.

    python -m benchmarks.soak --model=mnist --minutes=30             # 2 nodes x 2 tasks
    python -m benchmarks.soak --model=resnet20 --minutes=30 --out=docs/benchmarks
    python -m benchmarks.soak --model=resnet20 --minutes=3 -- --sync_batch_norm
    python -m benchmarks.soak --model=tutorial --minutes=20 --tasks_per_node=1   # a user's fit

It starts a local Slurm sandbox (or uses ``--sandbox_dir`` of a running one), submits
``jobs/<script>.sbatch`` with default model flags and an endless ``--train_steps`` (for
``tutorial``: ``jobs/train.sbatch examples/tf_tutorial.py``, endless epochs), and
every ``--sample_every`` seconds reads each rank's thread count (``/proc/PID/task``),
resident memory (``VmRSS``) and open file descriptors (``/proc/PID/fd``). Every rank of a
sandbox job is a process on this machine. After ``--minutes`` the job must still be
running; it is cancelled, and the trends after ``--warmup`` seconds of training (from the
chief's first step, which a loaded machine reaches late) are judged: threads
and fds flat (growth within a few), RSS growth under 5 % and its slope over the last
half of the samples under ``--max_rss_slope`` MB/h per rank. Writes ``soak-<model>.json``
and ``soak-<model>.png``; exits 1 when the job died or a resource grew.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    REPO,
    JSONDict,
    growth_problems,
    job_state,
    machine_info,
    markdown_table,
    rank_pids,
    read_usage,
    slope_per_hour,
    submit_job,
    trend,
)
from benchmarks.protocol import figure, record_name
from slurmtf.events import parse_events

ENDLESS = "--train_steps=1000000000"
MODELS = {  # name -> (job script, its arguments, the arguments that make it endless)
    "mnist": ("mnist.sbatch", (), (ENDLESS,)),
    "resnet20": ("resnet.sbatch", ("--resnet_size=20",), (ENDLESS,)),
    # A user's unmodified Keras 3 model.fit script (TensorFlow's tutorial shape), each
    # task started by python -m slurmtf.run.
    "tutorial": (
        "train.sbatch",
        (str(REPO / "examples" / "tf_tutorial.py"),),
        ("--epochs=1000000", "--steps_per_epoch=200"),
    ),
}
# Allowed RSS slope (MB/h per rank) over the last half of the samples after warm-up, so
# slow growth cannot hide in a small total. 25 MB/h: the target of a 30-minute run (flat
# 30-minute runs measured +8 to +22 MB/h, docs/SOAK.md). Short soaks are noisier: see
# CI_MAX_RSS_SLOPE_MB_H.
MAX_RSS_SLOPE_MB_H = 25.0
# The 3-minute CI soak judges ~70 s of samples: in 3-minute windows of flat runs that
# last-half slope reached +375 MB/h (p95 +242), while the per-collective leak it guards
# against grew +1,757 to +2,360 MB/h in the same windows (docs/SOAK.md).
CI_MAX_RSS_SLOPE_MB_H = 800.0


def verdict(ranks: JSONDict, max_rss_slope_mb_h: float = MAX_RSS_SLOPE_MB_H) -> list[str]:
    """The problems in per-rank trends (empty: flat).

    RSS must neither grow in total (last fifth against first fifth) nor still be rising
    over the last half of the samples faster than ``max_rss_slope_mb_h`` per rank.
    """
    problems = []
    for rank, t in sorted(ranks.items()):
        problems += growth_problems(f"rank {rank}", t)
        rising = t["rss_kb"]["last_half_slope_per_hour"] / 1024
        if rising > max_rss_slope_mb_h:
            problems.append(
                f"rank {rank}: RSS still rising at {rising:+.0f} MB/h over the last half "
                f"(limit {max_rss_slope_mb_h:g} MB/h)"
            )
    return problems


@dataclasses.dataclass(frozen=True)
class SoakPlan:
    """What to soak, for how long, and how it is sampled."""

    model: str = "mnist"
    minutes: float = 30.0
    nodes: int = 2
    tasks_per_node: int = 2
    sample_every: float = 5.0
    warmup: float = 120.0  # seconds of training (from the chief's first step) left out
    model_flags: tuple[str, ...] = ()
    sbatch_options: tuple[str, ...] = ("--gres=none",)
    gpus_per_node: int = 0  # fake GPUs of the sandbox the soak starts itself
    # Sample until the job ends by itself (its --train_steps), which must be COMPLETED
    # within ``minutes``; otherwise the job must still run after ``minutes``.
    until_done: bool = False
    max_rss_slope_mb_h: float = MAX_RSS_SLOPE_MB_H  # last-half RSS slope allowed per rank
    # SLURMTF_WARM_STANDBY of the job: "auto" starts the next attempt's warm ranks 2
    # minutes in, whose imports share the machine's cores with the ranks sampled here.
    warm: str = "auto"

    def submit(self, sandbox: Any, work: Path) -> str:
        """Submit the job script with the model's flags (endless unless ``until_done``)."""
        script, flags, endless = MODELS[self.model]
        sbatch = [f"--nodes={self.nodes}", f"--ntasks-per-node={self.tasks_per_node}",
                  *self.sbatch_options, f"--time={int(self.minutes) + 15}",
                  f"--output={work}/job-%j.out"]  # fmt: skip
        args = [*flags, *([] if self.until_done else endless), *self.model_flags]
        env = {"MODEL_DIR": str(work / "model"), "LOG_DIR": str(work / "logs"),
               "SLURMTF_WARM_STANDBY": self.warm}  # fmt: skip
        return submit_job(sandbox, [*sbatch, str(REPO / "jobs" / script), *args], env)


def run(plan: SoakPlan, *, sandbox: Any = None, work_dir: Path | None = None) -> JSONDict:
    """Run the soak and return its result (samples, trends, problems).

    ``sandbox`` is a running :class:`slurmtf.sandbox.Sandbox` with enough nodes; without
    one, a sandbox of ``plan.nodes`` nodes is started in ``work_dir`` and stopped after.
    """
    from slurmtf.sandbox import Sandbox

    work = Path(work_dir or tempfile.mkdtemp(prefix=f"soak-{plan.model}-"))
    own = sandbox is None
    if own:
        sandbox = Sandbox(work / "sandbox", nodes=plan.nodes, gpus_per_node=plan.gpus_per_node)
        sandbox.up()
    try:
        return _soak(sandbox, plan, work)
    finally:
        if own:
            sandbox.down()


def _soak(sandbox: Any, plan: SoakPlan, work: Path) -> JSONDict:
    job = plan.submit(sandbox, work)
    started = time.monotonic()
    try:
        pids = _wait_for_ranks(job, plan.nodes * plan.tasks_per_node, sandbox)
        samples, died, firsts = _sample(pids, plan, work / "logs" / "rank0.out")
        state = job_state(sandbox, job)
        if plan.until_done:
            state, died = _final_state(sandbox, job, died)
    finally:
        sandbox.run(["scancel", job], check=False)
    rank_out = work / "logs" / "rank0.out"
    text = rank_out.read_text(errors="replace") if rank_out.exists() else ""
    progress = [e for e in parse_events(text) if e["event"] == "progress"]
    expected = "COMPLETED" if plan.until_done else "RUNNING"
    # A rank ending is the job finishing in until_done mode; else always a failure.
    ended = "" if plan.until_done and state == expected else died
    ended = ended or ("" if state == expected else f"job {job} {state or 'gone'}")
    # The warm-up is training time: it counts from the chief's first step, which a loaded
    # machine can reach only a minute in (the first trace), after the sampling began.
    trained = firsts.get("trains") or 0.0
    settle = max(plan.warmup, plan.sample_every)  # the evaluation's own warm-up
    warmup, until = judged_window(samples, trained + plan.warmup, firsts.get("eval"), settle)
    return {
        "name": "soak",
        "model": plan.model,
        "model_flags": [*MODELS[plan.model][1], *plan.model_flags],
        "nodes": plan.nodes,
        "tasks_per_node": plan.tasks_per_node,
        "minutes": plan.minutes,
        "warmup_s": warmup,
        "until_s": None if until == math.inf else until,  # None: to the end
        "job_id": job,
        "wall_s": time.monotonic() - started,
        "steps": progress[-1]["step"] if progress else 0,
        "examples_per_sec": [(e["step"], e["examples_per_sec"]) for e in progress],
        "machine": machine_info(),
        "samples": samples,
        "max_rss_slope_mb_h": plan.max_rss_slope_mb_h,
        **_summarise(samples, warmup, ended, plan.max_rss_slope_mb_h, until),
    }


def judged_window(
    samples: Sequence[JSONDict], warmup: float, first_eval: float | None, settle: float
) -> tuple[float, float]:
    """The seconds whose samples are judged, ``(start, end)``.

    A rank's steady state starts once every phase ran once and settled: the evaluation
    pipeline's tf.data threads start at the first evaluation and stay, and its buffers
    fill over the ``settle`` seconds that follow (docs/SOAK.md). So the window starts then;
    when fewer samples follow that than precede the evaluation (a slow machine, or a fast
    one that evaluates mid-run), the window is the training before it instead: a steady
    state too, of one phase.
    """
    if first_eval is None:
        return warmup, math.inf
    after = max(warmup, first_eval + settle)
    times = [s["t"] for s in samples]
    later = sum(t >= after for t in times)
    earlier = sum(warmup <= t < first_eval for t in times)
    return (after, math.inf) if later >= earlier else (warmup, first_eval)


def _final_state(sandbox: Any, job: str, died: str, timeout: float = 120) -> tuple[str, str]:
    """Wait for the job to leave the queue's active states; (state, why it ended early)."""
    deadline = time.monotonic() + timeout
    while (state := job_state(sandbox, job)) in ("RUNNING", "COMPLETING", "CONFIGURING"):
        if time.monotonic() > deadline:
            return state, f"job {job} still {state} {timeout:.0f} s after its ranks ended"
        time.sleep(1)
    return state, died


FIRSTS = ("trains", "eval")  # the chief's events whose first sight the sampling notes


def _sample(
    pids: dict[int, int], plan: SoakPlan, chief_out: Path
) -> tuple[list[JSONDict], str, dict[str, float]]:
    """Sample every rank until ``plan.minutes`` pass (or, ``until_done``, until the ranks
    end); (samples, why it stopped, seconds to the chief's first ``trains`` (its first
    step) and ``eval`` events, of those seen)."""
    samples: list[JSONDict] = []
    firsts: dict[str, float] = {}
    t0 = time.monotonic()
    while (now := time.monotonic() - t0) < plan.minutes * 60:
        for rank, pid in sorted(pids.items()):
            usage = read_usage(pid)
            if usage is None:
                return samples, f"rank {rank} (pid {pid}) exited after {now:.0f} s", firsts
            samples.append({"t": now, "rank": rank, **dataclasses.asdict(usage)})
        if len(firsts) < len(FIRSTS):
            for name in _seen(chief_out) & set(FIRSTS) - set(firsts):
                firsts[name] = now
        time.sleep(plan.sample_every)
    return samples, "", firsts


def _seen(chief_out: Path) -> set[str]:
    """The names of the events in the chief's output so far."""
    text = chief_out.read_text(errors="replace") if chief_out.exists() else ""
    return {str(e["event"]) for e in parse_events(text)}


def _wait_for_ranks(job: str, count: int, sandbox: Any, timeout: float = 300) -> dict[int, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = rank_pids(job)
        if len(pids) == count:
            return pids
        state = job_state(sandbox, job)
        if state not in ("", "PENDING", "CONFIGURING", "RUNNING"):
            raise RuntimeError(f"job {job} ended ({state}) before all {count} ranks started")
        time.sleep(1)
    raise RuntimeError(f"job {job}: {len(rank_pids(job))} of {count} ranks after {timeout} s")


def _summarise(
    samples: list[JSONDict],
    warmup: float,
    died: str,
    max_rss_slope_mb_h: float,
    until: float = math.inf,
) -> JSONDict:
    ranks: JSONDict = {}
    for rank in sorted({s["rank"] for s in samples}):
        mine = [s for s in samples if s["rank"] == rank]
        times = [s["t"] for s in mine]
        keys = ("threads", "rss_kb", "fds", *(k for k in PARTS if k in mine[0]))
        try:
            ranks[str(rank)] = {
                key: trend(times, [s[key] for s in mine], warmup, until) for key in keys
            }
        except ValueError as exc:
            died = died or f"rank {rank}: {exc}"
    problems = ([died] if died else []) + verdict(ranks, max_rss_slope_mb_h)
    return {"ranks": ranks, "problems": problems, "passed": not problems}


def rejudge(result: JSONDict, first_minutes: float | None = None) -> JSONDict:
    """``result`` judged again from its samples, cut to its first ``first_minutes``.

    A long soak's first 30 minutes are a 30-minute soak of the same job: the same
    warm-up, the same last-half slope limit. Also adds each rank's RSS slope over the
    last hour of the (cut) samples, ``last_hour_rss_slope_mb_h``.
    """
    end = first_minutes * 60 if first_minutes is not None else float("inf")
    samples = [s for s in result["samples"] if s["t"] <= end]
    if not samples:
        raise ValueError(f"no samples in the first {first_minutes} minutes")
    cut = max(s["t"] for s in samples)
    limit = result.get("max_rss_slope_mb_h", MAX_RSS_SLOPE_MB_H)  # older files lack it
    until = result.get("until_s") or math.inf  # None or older files: to the end
    judged = _summarise(samples, result["warmup_s"], "", limit, until)
    last_hour = {
        str(rank): slope_per_hour(
            [
                (s["t"], s["rss_kb"] / 1024)
                for s in samples
                if s["rank"] == rank and s["t"] >= max(result["warmup_s"], cut - 3600)
            ]
        )
        for rank in sorted({s["rank"] for s in samples})
    }
    minutes = first_minutes if first_minutes is not None else result["minutes"]
    steps = result["steps"] if first_minutes is None else f"{result['steps']} in the whole run,"
    return {**result, **judged, "minutes": minutes, "steps": steps, "samples": samples,
            "max_rss_slope_mb_h": limit,
            "last_hour_rss_slope_mb_h": last_hour}  # fmt: skip


PARTS = {"anon_kb": "of it anonymous (RssAnon)", "file_kb": "of it file pages (RssFile)"}


def _memory_cell(t: JSONDict) -> str:
    return (f"{t['start'] / 1024:.0f} -> {t['end'] / 1024:.0f} MB "
            f"({t['slope_per_hour'] / 1024:+.1f} MB/h, "
            f"last half {t['last_half_slope_per_hour'] / 1024:+.1f} MB/h)")  # fmt: skip


def markdown(result: JSONDict) -> str:
    """The per-rank table: start, end and slope of threads, RSS and fds after warm-up."""
    rows = []
    for rank, t in sorted(result["ranks"].items(), key=lambda kv: int(kv[0])):
        th, rss, fds = t["threads"], t["rss_kb"], t["fds"]
        rows.append([
            rank,
            f"{th['start']:.0f} -> {th['end']:.0f} ({th['slope_per_hour']:+.1f}/h)",
            f"{rss['start'] / 1024:.0f} -> {rss['end'] / 1024:.0f} MB "
            f"({100 * rss['growth_fraction']:+.2f} %, {rss['slope_per_hour'] / 1024:+.1f} MB/h, "
            f"last half {rss['last_half_slope_per_hour'] / 1024:+.1f} MB/h)",
            f"{fds['start']:.0f} -> {fds['end']:.0f} ({fds['slope_per_hour']:+.1f}/h)",
            *(_memory_cell(t[key]) for key in PARTS if key in t),
        ])  # fmt: skip
    first: JSONDict = next(iter(result["ranks"].values()), {})
    parts = [label for key, label in PARTS.items() if key in first]
    table = markdown_table(["rank", "threads", "RSS", "open fds", *parts], rows)
    verdict_line = "PASS: flat" if result["passed"] else "FAIL: " + "; ".join(result["problems"])
    if "last_hour_rss_slope_mb_h" in result:
        slopes = ", ".join(
            f"rank {r} {v:+.1f}" for r, v in sorted(result["last_hour_rss_slope_mb_h"].items())
        )
        verdict_line += f"\n\nRSS slope over the last hour (MB/h): {slopes}"
    return (
        f"{result['model']} ({' '.join(result['model_flags']) or 'default flags'}), "
        f"{result['nodes']} nodes x "
        f"{result['tasks_per_node']} tasks, {result['minutes']:g} min, {result['steps']} steps; "
        f"after a {result['warmup_s']:g} s warm-up{_until(result)}:\n\n{table}\n\n"
        f"{verdict_line}\n"
    )


def _until(result: JSONDict) -> str:
    until = result.get("until_s")
    return f", until the first evaluation at {until:g} s" if until else ""


def plot(result: JSONDict, out_dir: Path, record: str | None = None) -> list[Path]:
    path = out_dir / f"{record or 'soak-' + result['model']}.png"
    keys = [("threads", "threads", 1), ("rss_kb", "RSS (MB)", 1024), ("fds", "open fds", 1)]
    if "anon_kb" in result["samples"][0]:
        keys += [("anon_kb", "RssAnon (MB)", 1024), ("file_kb", "RssFile (MB)", 1024)]
    with figure(path, (7.0, 2.5 * len(keys)), rows=len(keys), dpi=110) as axes:
        for ax, (key, label, scale) in zip(axes, keys, strict=True):
            for rank in sorted({s["rank"] for s in result["samples"]}):
                mine = [s for s in result["samples"] if s["rank"] == rank]
                ax.plot([s["t"] / 60 for s in mine], [s[key] / scale for s in mine],
                        label=f"rank {rank}")  # fmt: skip
            ax.axvline(result["warmup_s"] / 60, color="gray", ls="--", lw=1)
            ax.set_ylabel(label)
            if key in ("threads", "rss_kb", "fds"):
                ax.set_ylim(bottom=0)  # the parts of RSS are drawn to their own scale
        axes[0].legend(fontsize=8, ncol=4)
        axes[-1].set_xlabel("minutes (dashed: end of warm-up)")
        axes[0].set_title(
            f"Soak: {result['model']}, {result['nodes']}x{result['tasks_per_node']} ranks"
        )
    return [path]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="mnist")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--tasks_per_node", type=int, default=2)
    parser.add_argument(
        "--gpus_per_node", type=int, default=0, help="fake GPUs per node of the soak's sandbox"
    )
    parser.add_argument("--sample_every", type=float, default=5.0, help="seconds")
    parser.add_argument(
        "--warmup", type=float, default=120.0,
        help="seconds of training left out (from the chief's first step)",
    )  # fmt: skip
    parser.add_argument(
        "--sbatch_option",
        action="append",
        help="an sbatch option for the job (repeat; default --gres=none)",
    )
    parser.add_argument(
        "--until_done",
        action="store_true",
        help="the model flags set --train_steps: sample until the job ends, which must be "
        "COMPLETED within --minutes",
    )
    parser.add_argument(
        "--max_rss_slope",
        type=float,
        default=MAX_RSS_SLOPE_MB_H,
        help="MB/h per rank the RSS may still rise over the last half of the samples",
    )
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks")
    parser.add_argument(
        "--record",
        help="write RECORD.json and RECORD.png instead of soak-MODEL: a variant kept beside "
        "the others, named soak-MODEL-WHAT (e.g. soak-mnist-2h)",
    )
    parser.add_argument(
        "--judge",
        type=Path,
        help="judge the samples of a soak's JSON again instead of running one "
        "(with --first_minutes: only its first minutes)",
    )
    parser.add_argument("--first_minutes", type=float, help="with --judge: cut the samples")
    parser.add_argument("model_flags", nargs="*", help="after --: flags for the model")
    args = parser.parse_args(argv)
    try:
        record = record_name(f"soak-{args.model}", args.record or f"soak-{args.model}")
    except argparse.ArgumentTypeError as exc:
        parser.error(f"--record: {exc}")
    if args.judge:
        judged = rejudge(json.loads(args.judge.read_text()), args.first_minutes)
        print(markdown(judged))
        return 0 if judged["passed"] else 1
    plan = SoakPlan(
        model=args.model,
        minutes=args.minutes,
        nodes=args.nodes,
        tasks_per_node=args.tasks_per_node,
        sample_every=args.sample_every,
        warmup=args.warmup,
        model_flags=tuple(args.model_flags),
        sbatch_options=tuple(args.sbatch_option or SoakPlan.sbatch_options),
        gpus_per_node=args.gpus_per_node,
        until_done=args.until_done,
        max_rss_slope_mb_h=args.max_rss_slope,
    )
    result = run(plan)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{record}.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out, record)
    print(markdown(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
