"""A stand-in ``sacct`` for the sandbox, which has no accounting database.

The sandbox puts a ``sacct`` script first on its own PATH that runs this module. It
answers the questions submitit asks (``sacct -o JobID,State,NodeList --parsable2 -j
ID``) from ``squeue -t all`` (jobs seen in the last ``MinJobAge`` seconds, requeued
jobs included) and, for older jobs, from the job-completion log the sandbox's
slurmctld writes (``JobCompType=jobcomp/filetxt``). Parsing and rendering are pure.
``ExitCode`` is printed as the sandbox's Slurm release's sacct prints it: an exit code
above 128 less 128 before 25.11 (:mod:`slurmtf.slurm.sacct`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from slurmtf.errors import InputError
from slurmtf.slurm.release import SlurmRelease
from slurmtf.slurm.sacct import render_exit_code

# sacct field -> squeue format letter
SQUEUE_FIELDS = {
    "JobID": "%i",
    "JobIDRaw": "%A",
    "JobName": "%j",
    "State": "%T",
    "NodeList": "%N",
    "Partition": "%P",
    "NNodes": "%D",
    "Elapsed": "%M",
    "User": "%u",
    "Reason": "%r",
}
# sacct field -> key in a jobcomp/filetxt line
JOBCOMP_FIELDS = {
    "JobID": "JobId",
    "JobIDRaw": "JobId",
    "JobName": "Name",
    "State": "JobState",
    "NodeList": "NodeList",
    "Partition": "Partition",
    "NNodes": "NodeCnt",
    "ExitCode": "ExitCode",
    "Start": "StartTime",
    "End": "EndTime",
    "Submit": "SubmitTime",
}
DEFAULT_FIELDS = ["JobID", "JobName", "Partition", "State", "ExitCode"]
_SEP = "\x1f"
_PAIR = re.compile(r"(\w+)=(\S*)")


def squeue_format() -> str:
    return _SEP.join(SQUEUE_FIELDS.values())


def parse_squeue(text: str) -> list[dict[str, str]]:
    """Rows of ``squeue -h -o <squeue_format()>`` as sacct-named records."""
    records = []
    for line in text.splitlines():
        values = line.split(_SEP)
        if len(values) == len(SQUEUE_FIELDS):
            records.append(dict(zip(SQUEUE_FIELDS, (v.strip() for v in values), strict=True)))
    return records


def parse_jobcomp(text: str) -> list[dict[str, str]]:
    """Lines of a jobcomp/filetxt log as sacct-named records (array tasks as ``A_T``)."""
    records = []
    for line in text.splitlines():
        pairs = dict(_PAIR.findall(line))
        if "JobId" not in pairs:
            continue
        record = {name: pairs.get(key, "") for name, key in JOBCOMP_FIELDS.items()}
        if pairs.get("ArrayJobId", "0") not in {"", "0"} and "ArrayTaskId" in pairs:
            record["JobID"] = f"{pairs['ArrayJobId']}_{pairs['ArrayTaskId']}"
        records.append(record)
    return records


def _main_id(job_id: str) -> str:
    return job_id.split("_", 1)[0].split(".", 1)[0]


def select(
    live: Iterable[dict[str, str]], finished: Iterable[dict[str, str]], ids: Sequence[str]
) -> list[dict[str, str]]:
    """Records of the wanted jobs (all if none): live fields win over the completion log."""
    wanted = set(ids)
    chosen: dict[str, dict[str, str]] = {}
    for record in [*finished, *live]:
        jid = record.get("JobID", "")
        raw = record.get("JobIDRaw", "")
        if wanted and not ({jid, _main_id(jid), raw} & wanted):
            continue
        chosen[jid] = {**chosen.get(jid, {}), **record}
    return list(chosen.values())


def render(
    records: Iterable[dict[str, str]], fields: Sequence[str], *, parsable: str, header: bool
) -> str:
    """``--parsable2`` (``|`` between), ``--parsable`` (``|`` after each) or columns."""
    rows = [list(fields)] if header else []
    rows += [[r.get(f, "") for f in fields] for r in records]
    if parsable == "2":
        return "".join("|".join(row) + "\n" for row in rows)
    if parsable == "1":
        return "".join("|".join(row) + "|\n" for row in rows)
    widths = [max([10, *(len(row[i]) for row in rows)]) for i in range(len(fields))]
    return "".join(
        " ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() + "\n"
        for row in rows
    )


def as_release_prints(
    records: Iterable[dict[str, str]], release: SlurmRelease | None
) -> list[dict[str, str]]:
    """The records with ``ExitCode`` as ``release``'s sacct prints it."""
    return [
        {**r, "ExitCode": render_exit_code(r["ExitCode"], release)} if "ExitCode" in r else r
        for r in records
    ]


def _release() -> SlurmRelease | None:
    """The release of the Slurm on PATH (the sandbox's), ``None`` when it does not say."""
    done = subprocess.run(["squeue", "-V"], capture_output=True, text=True, check=False)
    try:
        return SlurmRelease.parse(done.stdout, "squeue -V")
    except InputError:
        return None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sacct", description="slurmtf sandbox stand-in for sacct")
    p.add_argument("-j", "--jobs", action="append", default=[])
    p.add_argument("-o", "--format", default=",".join(DEFAULT_FIELDS))
    p.add_argument("-P", "--parsable2", action="store_true")
    p.add_argument("-p", "--parsable", action="store_true")
    p.add_argument("-n", "--noheader", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args, _ignored = _parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    ids = [i for group in args.jobs for i in group.split(",") if i]
    fields = [f.split("%", 1)[0] for f in args.format.split(",") if f]
    unknown = [f for f in fields if f not in SQUEUE_FIELDS and f not in JOBCOMP_FIELDS]
    if unknown:
        known = sorted(set(SQUEUE_FIELDS) | set(JOBCOMP_FIELDS))
        print(f"sacct (sandbox): unknown field(s) {unknown}. HINT: one of {known}", file=sys.stderr)
        return 1
    done = subprocess.run(
        ["squeue", "-h", "-t", "all", "-o", squeue_format()],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        print(f"sacct (sandbox): squeue failed: {done.stderr.strip()}", file=sys.stderr)
        return 1
    finished: list[dict[str, str]] = []
    sandbox_dir = os.environ.get("SLURMTF_SANDBOX_DIR")
    if sandbox_dir:
        with contextlib.suppress(OSError):
            finished = parse_jobcomp((Path(sandbox_dir) / "log" / "jobcomp.log").read_text())
    records = select(parse_squeue(done.stdout), finished, ids)
    if "ExitCode" in fields:
        records = as_release_prints(records, _release())
    parsable = "2" if args.parsable2 else "1" if args.parsable else ""
    sys.stdout.write(render(records, fields, parsable=parsable, header=not args.noheader))
    return 0


if __name__ == "__main__":
    sys.exit(main())
