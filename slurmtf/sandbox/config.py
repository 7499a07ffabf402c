"""Pure rendering of a sandbox's files (slurm.conf, gres.conf, hosts, env) from values.

Nothing here touches the file system, the environment or the network: a
:class:`SandboxConfig` goes in, text comes out, so every file the sandbox writes
can be compared to a stored expectation.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass
from pathlib import Path

from slurmtf import firewall
from slurmtf.cluster.ports import DEFAULT_PORT, WINDOW_LOW
from slurmtf.errors import InputError
from slurmtf.firewall import rules as firewall_rules
from slurmtf.sandbox import links
from slurmtf.slurm.release import CGROUP_PLUGIN_DISABLED, DEBIAN_12, SlurmRelease

MAX_NODES = 128  # 64 nodes x 16 tasks and spares: 1,024 ranks (docs/BENCHMARKS.md, "Width")
MAX_GPUS_PER_NODE = 16
DEFAULT_CPUS_PER_NODE = 8
MAX_CPUS_PER_NODE = 256
# The daemons' ports: above slurmd's own 6817/6818 and below every port the resolver
# gives a job (DEFAULT_PORT, then its per-job window), so that a job's TensorFlow ports
# never land on a daemon of the sandbox running it.
PORT_RANGE = (7000, DEFAULT_PORT)
PARTITION = "debug"
# Finished jobs stay visible to squeue (and so to the sacct shim) this long.
MIN_JOB_AGE_S = 300
# Munge credential lifetime: also the delay before a requeued job may start again
# (its begin time is now + cred_expire). The sandbox's default keeps requeues fast;
# Slurm's own default (real clusters) is 120.
DEFAULT_CRED_EXPIRE_S = 10
SLURM_CRED_EXPIRE_S = 120
MAX_CRED_EXPIRE_S = 3600
_NODE_PREFIX = "node"
# MpiParams=ports: the range Slurm reserves step ports from (srun --resv-ports), inside
# the resolver's per-job window; the sandbox's slice of it follows from its directory.
RESV_PORTS_SPAN = 1000
RESV_PORTS_SLICES = 20
# How slurmctld counts a node's CPUs (slurm.conf SelectTypeParameters): by core, the
# common choice and Slurm's default, or by CPU (hardware thread).
SELECT_TYPE_PARAMETERS = ("CR_Core", "CR_CPU")
THREADS_PER_CORE = (1, 2, 4)


@dataclass(frozen=True)
class SandboxConfig:
    """Everything that decides the content of a sandbox's files."""

    dir: Path
    nodes: int = 3
    gpus_per_node: int = 2
    cpus_per_node: int = DEFAULT_CPUS_PER_NODE
    ctld_port: int = 6817
    slurmd_ports: tuple[int, ...] = ()
    cluster_name: str = ""
    link: str = ""  # "" = all nodes on loopback; else a rate (``1gbit``) or ``unshaped``
    slurmd_timeout: int = 60  # s until a silent node is declared failed (node-failure tests)
    job_firewall: bool = False  # run slurmtf's per-job firewall as Prolog/Epilog (needs link)
    node_link: tuple[str, ...] = ()  # ``node3=100mbit``: a node's own rate (needs link)
    cred_expire: int = DEFAULT_CRED_EXPIRE_S  # s; also a requeued job's wait before it may start
    slurm_prefix: str = ""  # a Slurm build's install prefix; "" = the commands on PATH
    slurm_release: str = ""  # what that Slurm's ``sinfo --version`` says; "" = Debian 12's
    resv_ports: bool = True  # MpiParams=ports: steps may ask srun --resv-ports
    select_type_parameters: str = "CR_Core"  # SelectTypeParameters: CR_Core or CR_CPU
    def_cpu_per_gpu: int = 0  # DefCpuPerGPU: a site's CPUs per allocated GPU; 0 = unset
    threads_per_core: int = 1  # hardware threads a core (2: hyperthreads; CR_Core counts cores)
    resv_slice: int = -1  # the MpiParams=ports slice up chose; -1: the directory's own

    def __post_init__(self) -> None:
        check_cred_expire(self.cred_expire)
        self._check_cpus()
        self._check_slurm()
        if self.link:
            links.parse_rate(self.link)  # InputError naming --link
        self._check_node_link()
        if self.job_firewall and not self.link:
            raise InputError(
                "--job_firewall",
                True,
                "needs nodes with addresses of their own",
                "add --link 1gbit (or --link unshaped)",
            )
        if not self.dir.is_absolute():
            raise InputError("--dir", str(self.dir), "must be absolute", "pass an absolute path")
        if any(ch in str(self.dir) for ch in " \t\n#=,\"'\\"):
            raise InputError(
                "--dir",
                str(self.dir),
                "slurm.conf cannot hold this path (space, quote, '#', '=', ',')",
                "choose a directory whose path has none of these characters",
            )
        if not 1 <= self.nodes <= MAX_NODES:
            raise InputError("--nodes", self.nodes, f"must be 1..{MAX_NODES}", "use e.g. 3")
        if not 0 <= self.gpus_per_node <= MAX_GPUS_PER_NODE:
            raise InputError(
                "--gpus_per_node",
                self.gpus_per_node,
                f"must be 0..{MAX_GPUS_PER_NODE}",
                "use 0 for CPU-only nodes",
            )
        if not max(1, self.gpus_per_node) <= self.cpus_per_node <= MAX_CPUS_PER_NODE:
            raise InputError(
                "--cpus_per_node", self.cpus_per_node,
                f"must be at least the GPUs per node ({self.gpus_per_node}) and 1, at most "
                f"{MAX_CPUS_PER_NODE}",
                f"use e.g. {DEFAULT_CPUS_PER_NODE} (the nodes may claim more CPUs than the "
                "machine has)",
            )  # fmt: skip
        if self.slurmd_ports and len(self.slurmd_ports) != self.nodes:
            raise InputError(
                "slurmd_ports",
                self.slurmd_ports,
                f"needs one port per node ({self.nodes})",
                "use default_ports()",
            )
        if not self.cluster_name:
            object.__setattr__(self, "cluster_name", cluster_name_for(self.dir))
        if not self.slurmd_ports:
            ports = tuple(self.ctld_port + 1 + i for i in range(self.nodes))
            object.__setattr__(self, "slurmd_ports", ports)

    def _check_cpus(self) -> None:
        """``--select_type_parameters`` offered, ``--def_cpu_per_gpu`` fits the nodes."""
        if self.select_type_parameters not in SELECT_TYPE_PARAMETERS:
            raise InputError(
                "--select_type_parameters", self.select_type_parameters, "is not offered",
                f"one of {', '.join(SELECT_TYPE_PARAMETERS)}",
            )  # fmt: skip
        tpc = self.threads_per_core
        if isinstance(tpc, bool) or not isinstance(tpc, int) or tpc not in THREADS_PER_CORE:
            raise InputError(
                "--threads_per_core", tpc, "is not offered",
                f"one of {', '.join(map(str, THREADS_PER_CORE))} (2: hyperthreads)",
            )  # fmt: skip
        if self.cpus_per_node % tpc:
            raise InputError(
                "--threads_per_core", tpc, f"does not divide --cpus_per_node={self.cpus_per_node}",
                "give the nodes a multiple of it as CPUs",
            )  # fmt: skip
        value, most = self.def_cpu_per_gpu, self.cpus_per_node // max(1, self.gpus_per_node)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(
                "--def_cpu_per_gpu", value, "must be a whole number, 0 or more",
                "e.g. --def_cpu_per_gpu 2, or 0 to leave DefCpuPerGPU unset",
            )  # fmt: skip
        if value and not (self.gpus_per_node and value <= most):
            raise InputError(
                "--def_cpu_per_gpu", value,
                f"does not fit nodes of {self.cpus_per_node} CPUs and {self.gpus_per_node} GPUs",
                f"use 1..{most} on nodes with GPUs, or 0 to leave DefCpuPerGPU unset",
            )  # fmt: skip

    def _check_slurm(self) -> None:
        if self.slurm_release:
            SlurmRelease.parse(self.slurm_release, "slurm_release")
        if self.slurm_prefix and not self.slurm_prefix.startswith("/"):
            raise InputError(
                "--slurm",
                self.slurm_prefix,
                "must be an absolute path",
                "pass the prefix scripts/build-slurm.sh printed, e.g. /opt/slurm-26.05.3",
            )

    def _check_node_link(self) -> None:
        if self.node_link and not self.link:
            raise InputError(
                "--node_link",
                ",".join(self.node_link),
                "needs nodes with links of their own",
                "add --link 1gbit",
            )
        for text in self.node_link:
            links.parse_node_link(text, self.nodes)  # InputError naming --node_link

    @property
    def node_names(self) -> list[str]:
        return node_names(self.nodes)

    @property
    def release(self) -> SlurmRelease:
        """The Slurm release the daemons run (Debian 12's when not told)."""
        if not self.slurm_release:
            return DEBIAN_12
        return SlurmRelease.parse(self.slurm_release, "slurm_release")

    def daemon(self, name: str) -> str:
        """How to start daemon ``name`` (``slurmctld``, ``slurmd``): the prefix's own."""
        return f"{self.slurm_prefix}/sbin/{name}" if self.slurm_prefix else name

    @property
    def client_dir(self) -> str:
        """The folder of the client commands to put on PATH ("" = leave PATH as it is)."""
        return f"{self.slurm_prefix}/bin" if self.slurm_prefix else ""

    @property
    def resv_port_range(self) -> tuple[int, int] | None:
        """``MpiParams=ports=LOW-HIGH`` (inclusive) of this sandbox, or None without."""
        if not self.resv_ports:
            return None
        if self.resv_slice >= 0:
            low = WINDOW_LOW + self.resv_slice * RESV_PORTS_SPAN
            return low, low + RESV_PORTS_SPAN - 1
        return resv_port_range(self.dir)

    @property
    def cpu_policy(self) -> str:
        """How jobs get CPUs here, in slurm.conf's words."""
        default = "no DefCpuPerGPU"
        if self.def_cpu_per_gpu:
            default = f"DefCpuPerGPU={self.def_cpu_per_gpu}"
        threads = f", {self.threads_per_core} threads a core" if self.threads_per_core > 1 else ""
        return f"SelectTypeParameters={self.select_type_parameters}, {default}{threads}"

    @property
    def conf_path(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def bin_dir(self) -> Path:
        return self.dir / "bin"

    @property
    def task_prolog(self) -> Path:
        return self.bin_dir / "task_prolog"

    def scratch(self, node: str) -> Path:
        """A node's own local scratch (``$SLURM_TMPDIR`` of its tasks)."""
        return self.dir / "scratch" / node

    @property
    def munge_socket(self) -> Path:
        return self.dir / "munge" / "munge.socket"

    @property
    def link_plan(self) -> links.LinkPlan | None:
        """Namespaces and addresses when nodes have links of their own, else None."""
        if not self.link:
            return None
        rates = tuple(links.parse_node_link(text, self.nodes) for text in self.node_link)
        return link_plan_for(self.dir, self.nodes, links.parse_rate(self.link), rates)

    @property
    def ctld_addr(self) -> str:
        plan = self.link_plan
        return plan.ctld_addr if plan else "127.0.0.1"

    def node_addr(self, index: int) -> str:
        plan = self.link_plan
        return plan.node_addr(index) if plan else "127.0.0.1"


def check_cred_expire(seconds: object) -> int:
    """``--cred_expire`` as seconds, or an :class:`InputError` naming the flag."""
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise InputError(
            "--cred_expire", seconds, "must be whole seconds", f"use e.g. {SLURM_CRED_EXPIRE_S}"
        )
    if not 5 <= seconds <= MAX_CRED_EXPIRE_S:
        raise InputError(
            "--cred_expire",
            seconds,
            f"must be 5..{MAX_CRED_EXPIRE_S} seconds",
            f"use {SLURM_CRED_EXPIRE_S} (Slurm's default) or {DEFAULT_CRED_EXPIRE_S} "
            "(the sandbox's, fast requeues)",
        )
    return seconds


def parse_cred_expire(text: str) -> int:
    """``--cred_expire`` as typed (``120``) to checked seconds."""
    try:
        seconds = int(text.strip())
    except ValueError:
        raise InputError(
            "--cred_expire", text, "must be whole seconds", f"use e.g. {SLURM_CRED_EXPIRE_S}"
        ) from None
    return check_cred_expire(seconds)


def node_names(count: int) -> list[str]:
    """``node1..nodeN`` (no zero padding: Slurm's own order is the numeric one)."""
    return [f"{_NODE_PREFIX}{i}" for i in range(1, count + 1)]


def dir_digest(path: Path) -> str:
    return hashlib.sha256(str(path).encode()).hexdigest()


def cluster_name_for(path: Path) -> str:
    """A short cluster name that differs between sandbox directories."""
    return "sbx" + dir_digest(path)[:8]


def link_plan_for(
    path: Path, nodes: int, rate_bps: int, node_rates: tuple[tuple[int, int], ...] = ()
) -> links.LinkPlan:
    """The network plan of the sandbox in ``path``: a namespace prefix unique to it."""
    digest = dir_digest(path)
    return links.LinkPlan(
        prefix="stf" + digest[24:30],
        nodes=nodes,
        rate_bps=rate_bps,
        subnet=int(digest[30:32], 16),
        node_rates=node_rates,
    )


def preferred_port_base(path: Path, nodes: int) -> int:
    """A port base derived from the directory, so sandboxes rarely collide.

    The caller still checks that the ports are free and moves on if not.
    """
    low, high = PORT_RANGE
    span = (high - low) // (MAX_NODES + 1)
    return low + (int(dir_digest(path)[8:16], 16) % span) * (MAX_NODES + 1)


def resv_port_range(path: Path) -> tuple[int, int]:
    """The sandbox's MpiParams port range: a slice of the resolver's per-job window chosen
    by its directory (``up`` takes another where a running sandbox has this one)."""
    low = WINDOW_LOW + resv_slice_of(path) * RESV_PORTS_SPAN
    return low, low + RESV_PORTS_SPAN - 1


def resv_slice_of(path: Path) -> int:
    """The slice of the step-port window a sandbox directory prefers."""
    return int(dir_digest(path)[32:40], 16) % RESV_PORTS_SLICES


def first_job_id(path: Path) -> int:
    """A first job id that differs between directories (job ids seed per-job ports).

    The resolver's port base follows ``job_id % 200``; the low digits are spread too, so
    that two sandboxes on one machine start in different port slots.
    """
    digest = int(dir_digest(path)[16:24], 16)
    return (digest % 900 + 100) * 1000 + (digest // 900) % 200


SOCKET_PATH_MAX = 107  # a Unix socket's path (sun_path: 108 bytes with the final NUL)
BATCH_STEP_ID = 4294967291  # SLURM_BATCH_SCRIPT: the longest step id in a socket's name
JOB_ID_DIGITS = 8  # job ids stay below MaxJobId's default, 67,043,328


def check_socket_room(cfg: SandboxConfig) -> None:
    """Each slurmstepd listens on ``<spool>/<node>_<job>.<step>``: refuse a ``--dir`` too
    long for that path, before a job's first step fails on it (its batch step's
    ``fatal: Could not create domain socket``, and the job requeued again and again)."""
    node = cfg.node_names[-1]
    longest = f"{cfg.dir}/spool/{node}/{node}_{'9' * JOB_ID_DIGITS}.{BATCH_STEP_ID}"
    if len(longest) > SOCKET_PATH_MAX:
        room = SOCKET_PATH_MAX - (len(longest) - len(str(cfg.dir)))
        raise InputError(
            "--dir",
            str(cfg.dir),
            f"is too long for slurmstepd's sockets under it ({len(longest)} characters, "
            f"over the {SOCKET_PATH_MAX} of a Unix socket's path)",
            f"use a directory of at most {room} characters, e.g. /tmp/slurmtf-sandbox",
        )


def render_slurm_conf(cfg: SandboxConfig) -> str:
    """The sandbox's slurm.conf: multiple slurmd on one host, no accounting."""
    d = cfg.dir
    lines = [
        "# Generated by `slurmtf sandbox up`; edits are overwritten.",
        f"ClusterName={cfg.cluster_name}",
        f"SlurmctldHost=localhost({cfg.ctld_addr})",
        f"SlurmctldPort={cfg.ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"AuthInfo=socket={cfg.munge_socket},cred_expire={cfg.cred_expire}",
        f"StateSaveLocation={d}/state",
        f"SlurmdSpoolDir={d}/spool/%n",
        f"SlurmctldPidFile={d}/run/slurmctld.pid",
        f"SlurmdPidFile={d}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log",
        f"SlurmdLogFile={d}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={d}/log/jobcomp.log",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "SelectType=select/cons_tres",
        f"SelectTypeParameters={cfg.select_type_parameters}",
        "EnforcePartLimits=ALL",
        "SchedulerParameters=batch_sched_delay=0,sched_interval=5,bf_interval=1",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "KillWait=5",
        f"TaskProlog={cfg.task_prolog}",
        f"MinJobAge={MIN_JOB_AGE_S}",
        "JobRequeue=1",
        f"FirstJobId={first_job_id(d)}",
        "SlurmctldTimeout=30",
        f"SlurmdTimeout={cfg.slurmd_timeout}",
        "InactiveLimit=0",
        "Waittime=0",
    ]
    ports = cfg.resv_port_range
    if ports is not None:
        lines.append(f"MpiParams=ports={ports[0]}-{ports[1]}")
    if cfg.job_firewall:
        lines += firewall_rules.slurm_conf_lines(str(firewall.PROLOG), str(firewall.EPILOG))
    return "\n".join([*lines, *node_lines(cfg)]) + "\n"


def node_lines(cfg: SandboxConfig) -> list[str]:
    """slurm.conf's nodes, their GPUs and CPUs (how a site hands them out), the partition."""
    lines, gres = [], ""
    if cfg.gpus_per_node:
        lines.append("GresTypes=gpu")
        if cfg.def_cpu_per_gpu:
            lines.append(f"DefCpuPerGPU={cfg.def_cpu_per_gpu}")
        gres = f" Gres=gpu:{cfg.gpus_per_node}"
    shape = f"CPUs={cfg.cpus_per_node}"
    if cfg.threads_per_core > 1:  # one socket of cores, each with its hardware threads
        cores = cfg.cpus_per_node // cfg.threads_per_core
        shape += f" Sockets=1 CoresPerSocket={cores} ThreadsPerCore={cfg.threads_per_core}"
    lines.append(f"NodeName=DEFAULT {shape} RealMemory=4000 State=UNKNOWN{gres}")
    for i, (name, port) in enumerate(zip(cfg.node_names, cfg.slurmd_ports, strict=True), 1):
        addr = cfg.node_addr(i)
        lines.append(f"NodeName={name} NodeHostname=localhost NodeAddr={addr} Port={port}")
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return lines


def gpu_device_paths(cfg: SandboxConfig) -> list[Path]:
    """The fake GPU device files: symlinks to /dev/null that gres.conf names."""
    return [cfg.dir / "dev" / f"nvidia{i}" for i in range(cfg.gpus_per_node)]


def render_firewall_settings(cfg: SandboxConfig, python: str) -> str:
    """``slurmtf-firewall.conf`` beside slurm.conf; node N logs to ``log/firewall-N.log``."""
    scontrol = f"{cfg.client_dir}/scontrol" if cfg.client_dir else ""
    log = str(cfg.dir / "log" / "firewall-%n.log")
    return firewall_rules.render_settings(python, log=log, scontrol=scontrol)


def render_gres_conf(cfg: SandboxConfig) -> str:
    """gres.conf with fake GPUs (``File=`` is required; a bare ``Count=`` leaves nodes INVAL)."""
    lines = [
        "# Generated by `slurmtf sandbox up`; fake GPUs are symlinks to /dev/null.",
        "AutoDetect=off",
    ]
    if cfg.gpus_per_node:
        last = cfg.gpus_per_node - 1
        files = f"{cfg.dir}/dev/nvidia[0-{last}]" if last else f"{cfg.dir}/dev/nvidia0"
        lines.append(f"Name=gpu File={files}")
    return "\n".join(lines) + "\n"


def render_cgroup_conf(cfg: SandboxConfig) -> str | None:
    """cgroup.conf for releases that load the cgroup plugin by default: disabled (the
    sandbox's nodes share one host and track processes with proctrack/linuxproc).
    None for releases before ``CgroupPlugin=disabled`` existed (they need no file)."""
    if cfg.release < CGROUP_PLUGIN_DISABLED:
        return None
    return (
        f"# Generated by `slurmtf sandbox up` for Slurm {cfg.release}; edits are overwritten.\n"
        "CgroupPlugin=disabled\n"
    )


def render_hosts(base: str, names: list[str], plan: links.LinkPlan | None = None) -> str:
    """The host's /etc/hosts plus node names: all on loopback, or each on its own address."""
    text = base if base.endswith("\n") or not base else base + "\n"
    if plan is None:
        return text + "# slurmtf sandbox nodes\n127.0.0.1 " + " ".join(names) + "\n"
    return (
        text + "# slurmtf sandbox nodes (own links)\n" + "\n".join(plan.hosts_lines(names)) + "\n"
    )


def render_task_prolog(cfg: SandboxConfig) -> str:
    """The TaskProlog: every task (batch step included) gets its node's own scratch
    directory as ``$SLURM_TMPDIR``, as a cluster's node-local disk would be."""
    scratch = shlex.quote(str(cfg.dir / "scratch"))
    return (
        "#!/bin/sh\n"
        "# slurmtf sandbox: node-local scratch, one directory per node\n"
        f'dir={scratch}/"${{SLURMD_NODENAME:-unknown}}"\n'
        'mkdir -p "$dir" && echo "export SLURM_TMPDIR=$dir"\n'
    )


def render_env(cfg: SandboxConfig) -> str:
    """Shell lines to ``eval`` (or ``source``) so Slurm commands talk to this sandbox."""
    conf = shlex.quote(str(cfg.conf_path))
    path = ":".join(shlex.quote(p) for p in (str(cfg.bin_dir), cfg.client_dir) if p)
    return f'export SLURM_CONF={conf}\nexport PATH={path}:"$PATH"\n'


def render_sacct_shim(python: str, sandbox_dir: Path) -> str:
    """The ``sacct`` placed first on the sandbox PATH: answers from squeue and jobcomp."""
    return (
        "#!/bin/sh\n"
        "# slurmtf sandbox: there is no accounting database; answer sacct from squeue\n"
        "# (recent jobs) and the job-completion log (older ones).\n"
        f"SLURMTF_SANDBOX_DIR={shlex.quote(str(sandbox_dir))} "
        f'exec {shlex.quote(python)} -m slurmtf.sandbox.sacct "$@"\n'
    )
