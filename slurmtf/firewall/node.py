"""The firewall on a node: Slurm's prolog adds the job's table, its epilog removes it.

Run by ``prolog.sh``/``epilog.sh`` as ``python -m slurmtf.firewall prolog|epilog``
with the environment slurmd gives them (measured on Slurm 22.05: ``SLURM_JOB_ID``,
``SLURM_NODELIST``, ``SLURM_JOB_CPUS_PER_NODE``, ``SLURM_JOB_UID``, ``SLURMD_NODENAME``,
``SLURM_CONF``, ``SLURM_HET_JOB_ID`` for each component of a heterogeneous job; no
``PATH`` and none of the job's own variables). Settings come from
``slurmtf-firewall.conf`` beside ``SLURM_CONF``.

Never fails the job: a prolog that exits non-zero drains the node, so every problem
(no ``nft``, a node name that does not resolve, bad settings) is one line in the log
and exit 0, and the job runs without its table.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurmtf.cluster.hostlists import expand_hostlist, parse_task_counts
from slurmtf.cluster.layout import check_address_template
from slurmtf.cluster.ports import parse_port_base
from slurmtf.errors import InputError, SlurmtfError
from slurmtf.firewall import rules
from slurmtf.slurm.scontrol import parse_records

NFT_PATHS = ("/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft")
TIMEOUT_S = 10.0
# (args, stdin) -> (exit status, stdout, stderr)
Run = Callable[[Sequence[str], str], tuple[int, str, str]]
Resolve = Callable[[str], list[str]]


class FirewallError(SlurmtfError, RuntimeError):
    """The job's table could not be built or applied."""


@dataclass(frozen=True)
class PrologEnv:
    """The few prolog/epilog variables the firewall reads."""

    job_id: int
    node: str
    het_job_id: int | None = None
    nodelist: str = ""
    cpus_per_node: str = ""
    uid: int | None = None
    conf: str = ""


def read_prolog_env(environ: Mapping[str, str]) -> PrologEnv:
    """The prolog's (or epilog's) environment as values; the one place that reads it."""

    def number(name: str) -> int | None:
        text = environ.get(name, "").strip()
        if not text:
            return None
        if not text.isdigit():
            raise InputError(name, text, "is not a number", "run this as Slurm's Prolog/Epilog")
        return int(text)

    job_id = number("SLURM_JOB_ID")
    if job_id is None:
        raise InputError("SLURM_JOB_ID", None, "is not set", "run this as Slurm's Prolog/Epilog")
    return PrologEnv(
        job_id=job_id,
        node=environ.get("SLURMD_NODENAME", "") or socket.gethostname(),
        het_job_id=number("SLURM_HET_JOB_ID"),
        nodelist=environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST", ""),
        cpus_per_node=environ.get("SLURM_JOB_CPUS_PER_NODE", ""),
        uid=number("SLURM_JOB_UID"),
        conf=environ.get("SLURM_CONF", ""),
    )


def settings_path(conf: str) -> Path:
    """``slurmtf-firewall.conf`` beside slurm.conf."""
    return Path(conf or "/etc/slurm/slurm.conf").parent / rules.SETTINGS_NAME


def read_settings(conf: str) -> dict[str, str]:
    path = settings_path(conf)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    return rules.parse_settings(text, str(path))


def run_command(args: Sequence[str], stdin: str) -> tuple[int, str, str]:
    done = subprocess.run(
        list(args), input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    return done.returncode, done.stdout, done.stderr


def resolve_name(name: str) -> list[str]:
    """Every address ``name`` resolves to (/etc/hosts, DNS: whatever the node uses)."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        raise FirewallError(f"node name {name!r} does not resolve ({exc})") from exc
    return [str(info[4][0]) for info in infos]


def parse_het_job(text: str) -> tuple[list[str], int]:
    """Nodes and CPUs of every component in ``scontrol show job -o <het id>``."""
    nodes: dict[str, None] = {}
    cpus = 0
    for fields in parse_records(text):
        if fields.get("NodeList", "(null)") not in {"", "(null)"}:
            nodes.update(dict.fromkeys(expand_hostlist(fields["NodeList"], name="NodeList")))
        if fields.get("NumCPUs", "").isdigit():
            cpus += int(fields["NumCPUs"])
    return list(nodes), cpus


def job_rules(
    env: PrologEnv, settings: Mapping[str, str], run: Run, resolve: Resolve
) -> rules.JobRules:
    """The job's table from its environment, settings, ``scontrol`` (het jobs only)."""
    nodes = expand_hostlist(env.nodelist, name="SLURM_NODELIST") if env.nodelist else []
    cpus = env.cpus_per_node
    max_tasks = sum(parse_task_counts(cpus, name="SLURM_JOB_CPUS_PER_NODE")) if cpus else 0
    if env.het_job_id is not None:
        scontrol = settings.get("scontrol") or "scontrol"
        code, out, err = run([scontrol, "show", "job", "-o", str(env.het_job_id)], "")
        if code != 0:
            raise FirewallError(f"scontrol show job {env.het_job_id} failed: {err.strip()}")
        nodes, max_tasks = parse_het_job(out)
    if not nodes:
        raise FirewallError(f"job {env.job_id} lists no node (SLURM_NODELIST is empty)")
    base = settings.get("port_base")
    template = settings.get("address_template")
    if template:
        check_address_template(template, "address_template")
    names = list(nodes) + ([template.format(host=n) for n in nodes] if template else [])
    peers4, peers6 = rules.split_families(a for name in names for a in resolve(name))
    return rules.JobRules(
        job_id=env.job_id,
        ports=rules.job_ports(
            env.het_job_id if env.het_job_id is not None else env.job_id,
            max(max_tasks, len(nodes)),
            parse_port_base(base, "port_base") if base else None,
        ),
        peers4=peers4,
        peers6=peers6,
        uid=env.uid,
    )


def find_nft(settings: Mapping[str, str]) -> str | None:
    """``nft`` from the settings, else from PATH or the usual places; None when absent."""
    wanted = settings.get("nft")
    found = [wanted] if wanted else [shutil.which("nft") or "", *NFT_PATHS]
    return next((path for path in found if path and Path(path).exists()), None)


def apply(nft: str, text: str, run: Run) -> None:
    code, _, err = run([nft, "-f", "-"], text)
    if code != 0:
        raise FirewallError(f"{nft} -f failed (exit {code}): {' '.join(err.split())[:300]}")


def log_line(settings: Mapping[str, str], node: str, line: str) -> None:
    """One line to ``log`` (``%n``: the node) from the settings, else to syslog."""
    target = settings.get("log", "").replace("%n", node)
    try:
        if target:
            with Path(target).open("a") as out:
                out.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")
            return
        import syslog

        syslog.openlog("slurmtf-firewall")
        syslog.syslog(syslog.LOG_WARNING if "NOT" in line else syslog.LOG_INFO, line)
    except OSError:
        print(line, file=sys.stderr)


def main(
    argv: Sequence[str],
    environ: Mapping[str, str] | None = None,
    run: Run = run_command,
    resolve: Resolve = resolve_name,
) -> int:
    """``prolog`` or ``epilog``; always 0 (a failing prolog would drain the node)."""
    start = time.monotonic()
    what = argv[0] if argv else ""
    settings: dict[str, str] = {}
    node, job = "?", "?"
    try:
        env = read_prolog_env(os.environ if environ is None else environ)
        node, job = env.node, str(env.job_id)
        settings = read_settings(env.conf)
        if what not in {"prolog", "epilog"}:
            raise InputError("argv", what, "is not prolog or epilog", "see slurm_conf_lines")
        nft = find_nft(settings)
        if nft is None:
            raise FirewallError("nft not found (install nftables)")
        if what == "prolog":
            found = job_rules(env, settings, run, resolve)
            apply(nft, rules.render_apply(found), run)
            ranges = ",".join(f"{a}-{b}" for a, b in found.ports)
            done = (
                f"table {found.table} added: tcp ports {ranges} open to "
                f"{len(found.peers4) + len(found.peers6)} addresses"
            )
        else:
            apply(nft, rules.render_remove(env.job_id), run)
            done = f"table {rules.table_name(env.job_id)} removed"
        took = (time.monotonic() - start) * 1000
        log_line(settings, node, f"{what} job {job} on {node}: {done} in {took:.0f} ms")
    except Exception as exc:  # the job must run whatever happened
        effect = "job runs without its firewall" if what == "prolog" else "its table may remain"
        log_line(settings, node, f"{what} job {job} on {node}: NOT done, {effect}: {exc}")
    return 0
