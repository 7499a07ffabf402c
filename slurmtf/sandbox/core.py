"""A local multi-node Slurm cluster: munged + slurmctld + N slurmd, all state in one dir.

``Sandbox(dir, nodes, gpus_per_node).up()`` writes the configuration, starts the
daemons and waits until every node is idle; ``down()`` cancels jobs, stops the
daemons it started (by PID) and kills what the jobs left behind. The PIDs, ports and
mount namespaces live in ``<dir>/sandbox.json``, so a later process can stop it.
With ``link="1gbit"`` (or ``"unshaped"``) every node gets its own network namespace and
a shaped link to a bridge (:mod:`slurmtf.sandbox.links`); those namespaces are recorded
there too and removed by ``down()``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from slurmtf.cluster.ports import WINDOW_LOW, ports_free
from slurmtf.errors import InputError, SlurmtfError
from slurmtf.firewall import rules as firewall_rules
from slurmtf.sandbox import config as cfgmod
from slurmtf.sandbox import daemons, links, port_slices
from slurmtf.sandbox.config import SandboxConfig
from slurmtf.slurm.release import installed_release
from slurmtf.slurm.runner import default_runner

log = logging.getLogger(__name__)

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
_BINARIES = ("slurmctld", "slurmd", "sbatch", "munged", "mungekey", "unshare")
_MUNGE_BINARIES = ("munged", "mungekey", "unshare")
_BUILD_HINT = "bash scripts/build-slurm.sh TARBALL prints the prefix of a build to pass"
# The Slurm build the sandbox runs when --slurm is not given ("" = Debian's packages).
PREFIX_VARIABLE = "SLURMTF_SLURM_PREFIX"
STATE_FILE = "sandbox.json"
# Client commands that must reach slurmctld; with links they enter the bridge namespace.
CLIENTS = ("sbatch", "srun", "salloc", "squeue", "scancel", "scontrol", "sinfo", "sattach",
           "sbcast", "sstat", "sprio")  # fmt: skip
START_TIMEOUT_S = 30.0


class SandboxError(SlurmtfError, RuntimeError):
    """The sandbox could not be started or stopped; the message carries log tails."""


def _state_of(cfg: SandboxConfig) -> dict[str, object]:
    """What ``sandbox.json`` records of a started sandbox (read back by
    ``Sandbox._config_from_state``), before its daemons and namespaces."""
    return {
        "nodes": cfg.nodes,
        "gpus_per_node": cfg.gpus_per_node,
        "cpus_per_node": cfg.cpus_per_node,
        "ctld_port": cfg.ctld_port,
        "slurmd_ports": list(cfg.slurmd_ports),
        "cluster_name": cfg.cluster_name,
        "pids": {},
        "namespaces": [],
        "link": cfg.link,
        "slurmd_timeout": cfg.slurmd_timeout,
        "job_firewall": cfg.job_firewall,
        "node_link": list(cfg.node_link),
        "cred_expire": cfg.cred_expire,
        "slurm_prefix": cfg.slurm_prefix,
        "slurm_release": cfg.slurm_release,
        "resv_ports": cfg.resv_ports,
        "select_type_parameters": cfg.select_type_parameters,
        "def_cpu_per_gpu": cfg.def_cpu_per_gpu,
        "threads_per_core": cfg.threads_per_core,
        "resv_slice": cfg.resv_slice,
        "netns": [],
    }


def _as_list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def default_dir() -> Path:
    return Path(os.environ.get("SLURMTF_SANDBOX_DIR") or "/tmp/slurmtf-sandbox")


def default_slurm_prefix() -> str:
    """``$SLURMTF_SLURM_PREFIX``: the Slurm build to run ("" = Debian's packages)."""
    return os.environ.get(PREFIX_VARIABLE, "").strip()


def check_slurm_prefix(prefix: str) -> None:
    """A build prefix must hold the daemons and the client commands."""
    wanted = ("sbin/slurmctld", "sbin/slurmd", "sbin/slurmstepd", "bin/sbatch", "bin/srun")
    missing = [part for part in wanted if not (Path(prefix) / part).is_file()]
    if missing:
        raise InputError(
            "--slurm", prefix, f"holds no Slurm build (missing {', '.join(missing)})", _BUILD_HINT
        )


def ensure_installed(prefix: str = "") -> None:
    """Install Slurm and munge from Debian packages when a binary is missing (root only).

    With a build ``prefix``, only munge comes from Debian: Slurm is the prefix's."""
    if prefix:
        check_slurm_prefix(prefix)
    names = _MUNGE_BINARIES if prefix else _BINARIES
    missing = [b for b in names if shutil.which(b) is None and not Path(f"/usr/sbin/{b}").exists()]
    if not missing:
        return
    if os.geteuid() != 0:
        raise SandboxError(
            f"missing {', '.join(missing)}; installing them needs root. "
            f"HINT: apt-get install {' '.join(PACKAGES)}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print(f"sandbox: installing {' '.join(PACKAGES)}", file=sys.stderr)
    packages = ("munge",) if prefix else PACKAGES
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages, "util-linux"],
    ):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SandboxError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-2000:]}")


def _real_binary(name: str, cfg: SandboxConfig) -> str:
    """The client binary the sandbox runs: the build's, else the installed one (never our
    own shim of the same name)."""
    if cfg.client_dir:
        return shutil.which(name, path=cfg.client_dir) or ""
    rest = [p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != cfg.bin_dir]
    return shutil.which(name, path=os.pathsep.join([*rest, "/usr/bin", "/usr/sbin"])) or ""


def slurm_release(prefix: str) -> str:
    """What the Slurm the sandbox would run says of its version (``26.05.3``)."""
    daemon = f"{prefix}/sbin/slurmctld" if prefix else _real_daemon("slurmctld")
    try:
        return str(installed_release(default_runner, daemon))
    except (SlurmtfError, ValueError) as exc:
        raise SandboxError(f"cannot tell the Slurm release of {daemon}: {exc}") from exc


def _real_daemon(name: str) -> str:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])
    return shutil.which(name, path=path) or name


def _pick_ports(sandbox_dir: Path, count: int) -> int:
    """A base port with ``count`` free ports after it, preferring the dir's own base."""
    low, high = cfgmod.PORT_RANGE
    start = cfgmod.preferred_port_base(sandbox_dir, count)
    step = cfgmod.MAX_NODES + 1
    for offset in range(0, high - low, step):
        base = low + (start - low + offset) % (high - low - step)
        if ports_free(base, count):
            return base
    raise SandboxError(f"no {count} free consecutive ports in {low}-{high}")


def _resv_slice(sandbox_dir: Path) -> int:
    """The directory's slice of the step-port window, else the next one no running
    sandbox uses (:mod:`slurmtf.sandbox.port_slices`)."""
    window, span = WINDOW_LOW, cfgmod.RESV_PORTS_SPAN
    used = [port_slices.slice_of(low, window, span) for low, _ in port_slices.running_ranges()]
    return port_slices.free_slice(cfgmod.resv_slice_of(sandbox_dir), used, cfgmod.RESV_PORTS_SLICES)


@dataclass
class Sandbox:
    """One sandbox directory. ``up()``, ``down()``, ``status()``, ``env()``.

    ``env()`` is the environment (a copy of ``os.environ`` with ``SLURM_CONF`` and
    the shim's bin dir first on ``PATH``) to pass to Slurm commands and jobs.
    """

    dir: Path = field(default_factory=default_dir)
    nodes: int = 3
    gpus_per_node: int = 2
    cfg: SandboxConfig | None = None
    link: str = ""  # "" = loopback; a rate such as "1gbit", or "unshaped": own namespaces
    slurmd_timeout: int = 60  # SlurmdTimeout: seconds until a silent node is declared failed
    job_firewall: bool = False  # slurmtf's per-job firewall as Prolog/Epilog (needs link)
    node_link: tuple[str, ...] = ()  # ``node3=100mbit``: one node's own rate (needs link)
    cred_expire: int = cfgmod.DEFAULT_CRED_EXPIRE_S  # s (Slurm's default 120): requeue delay
    slurm: str = field(default_factory=default_slurm_prefix)  # a build prefix; "" = Debian's
    resv_ports: bool = True  # MpiParams=ports in slurm.conf (srun --resv-ports works)
    cpus_per_node: int = cfgmod.DEFAULT_CPUS_PER_NODE
    select_type_parameters: str = "CR_Core"  # how slurmctld counts CPUs: CR_Core or CR_CPU
    def_cpu_per_gpu: int = 0  # DefCpuPerGPU, a site's CPUs per allocated GPU (0: unset)
    threads_per_core: int = 1  # 2: hyperthreaded cores (CR_Core hands out whole cores)

    def __post_init__(self) -> None:
        self.dir = Path(self.dir).absolute()
        self.slurm = str(self.slurm).rstrip("/") if str(self.slurm).strip() else ""
        # The per-job firewall's prolog runs before any step: it cannot open a step's
        # reserved ports, so a walled sandbox leaves MpiParams=ports out.
        self.resv_ports = self.resv_ports and not self.job_firewall
        self.settings()  # validate

    def settings(self, **started: Any) -> SandboxConfig:
        """The configuration these fields ask for; ``started``: what ``up`` adds (ports,
        the release found)."""
        return SandboxConfig(
            dir=self.dir,
            nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
            cpus_per_node=self.cpus_per_node,
            link=self.link,
            slurmd_timeout=self.slurmd_timeout,
            job_firewall=self.job_firewall,
            node_link=tuple(self.node_link),
            cred_expire=self.cred_expire,
            slurm_prefix=self.slurm,
            resv_ports=self.resv_ports,
            select_type_parameters=self.select_type_parameters,
            def_cpu_per_gpu=self.def_cpu_per_gpu,
            threads_per_core=self.threads_per_core,
            **started,
        )

    # ---- state -------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.dir / STATE_FILE

    def _read_state(self) -> dict[str, object]:
        try:
            data: dict[str, object] = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {}
        return data

    def _write_state(self, state: dict[str, object]) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.state_path)

    def _pids(self) -> dict[str, int]:
        raw = self._read_state().get("pids", {})
        return {str(k): int(v) for k, v in raw.items()} if isinstance(raw, dict) else {}

    def record_pid(self, name: str, pid: int) -> None:
        """Record a (re)started daemon, so that ``down()`` stops it too."""
        state = self._read_state()
        pids = state.get("pids", {})
        state["pids"] = {**(pids if isinstance(pids, dict) else {}), name: pid}
        self._write_state(state)

    def _config_from_state(self) -> SandboxConfig | None:
        state = self._read_state()
        if "ctld_port" not in state:
            return None
        ports = state.get("slurmd_ports", [])
        return SandboxConfig(
            dir=self.dir,
            nodes=int(str(state["nodes"])),
            gpus_per_node=int(str(state["gpus_per_node"])),
            cpus_per_node=int(str(state.get("cpus_per_node", cfgmod.DEFAULT_CPUS_PER_NODE))),
            ctld_port=int(str(state["ctld_port"])),
            slurmd_ports=tuple(int(p) for p in ports) if isinstance(ports, list) else (),
            link=str(state.get("link", "")),
            slurmd_timeout=int(str(state.get("slurmd_timeout", 60))),
            job_firewall=bool(state.get("job_firewall", False)),
            node_link=tuple(str(n) for n in _as_list(state.get("node_link"))),
            cred_expire=int(str(state.get("cred_expire", cfgmod.DEFAULT_CRED_EXPIRE_S))),
            slurm_prefix=str(state.get("slurm_prefix", "")),
            slurm_release=str(state.get("slurm_release", "")),
            resv_ports=bool(state.get("resv_ports", False)),
            select_type_parameters=str(state.get("select_type_parameters", "CR_Core")),
            def_cpu_per_gpu=int(str(state.get("def_cpu_per_gpu", 0))),
            threads_per_core=int(str(state.get("threads_per_core", 1))),
            resv_slice=int(str(state.get("resv_slice", -1))),
        )

    def config(self) -> SandboxConfig:
        if self.cfg is None:
            self.cfg = self._config_from_state()
        if self.cfg is None:
            raise SandboxError(
                f"no sandbox in {self.dir}. HINT: slurmtf sandbox up --dir {self.dir}"
            )
        return self.cfg

    def live_daemons(self) -> dict[str, int]:
        """The recorded daemons that still run (checked against their command line)."""
        marker = str(self.dir)
        return {name: pid for name, pid in self._pids().items() if daemons.alive(pid, marker)}

    def is_up(self) -> bool:
        pids = self._pids()
        return bool(pids) and len(self.live_daemons()) == len(pids)

    # ---- environment and commands -----------------------------------------
    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        cfg = self.config()
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(cfg.conf_path)
        first = [str(cfg.bin_dir), *([cfg.client_dir] if cfg.client_dir else [])]
        rest = [p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p not in first]
        env["PATH"] = os.pathsep.join(first + rest)
        env["SLURMTF_SANDBOX_DIR"] = str(self.dir)
        return env

    def run(
        self, args: list[str], timeout: float = 60.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this sandbox."""
        done = subprocess.run(
            args, env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise SandboxError(
                f"{' '.join(args)} failed (exit {done.returncode}): {done.stderr.strip()}"
            )
        return done

    def node_states(self) -> dict[str, str]:
        done = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=15, check=False)
        states = {}
        for line in done.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    # ---- up ----------------------------------------------------------------
    def up(self, timeout: float = START_TIMEOUT_S) -> bool:
        """Start the sandbox; return False if it was already up (nothing done)."""
        if self.is_up():
            self.cfg = self._config_from_state()
            return False
        if self._pids() or self._recorded_netns():
            self.down()  # half up: stop what is left and start clean
        cfgmod.check_socket_room(self.settings())
        ensure_installed(self.slurm)
        release = slurm_release(self.slurm)
        self.dir.mkdir(parents=True, exist_ok=True)
        with port_slices.choosing():  # no other sandbox takes these ports meanwhile
            base = _pick_ports(self.dir, self.nodes + 1)
            cfg = self.settings(
                ctld_port=base,
                slurmd_ports=tuple(base + 1 + i for i in range(self.nodes)),
                slurm_release=release,
                resv_slice=_resv_slice(self.dir) if self.resv_ports else -1,
            )
            self.cfg = cfg
            self._write_files(cfg)
            state = _state_of(cfg)
            self._write_state(state)
            try:
                self._make_links(cfg, state)
                self._start_daemons(cfg, state, timeout)
            except BaseException:
                self.down()
                raise
        return True

    def _write_files(self, cfg: SandboxConfig) -> None:
        d = cfg.dir
        for sub in ("state", "run", "log", "dev", "bin", *(f"spool/{n}" for n in cfg.node_names)):
            (d / sub).mkdir(parents=True, exist_ok=True)
        munge_dir = d / "munge"
        munge_dir.mkdir(exist_ok=True)
        munge_dir.chmod(0o755)  # munged refuses a 700 socket directory
        key = munge_dir / "munge.key"
        if not key.exists():
            done = subprocess.run(
                ["mungekey", "-c", "-k", str(key)], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise SandboxError(f"mungekey failed: {done.stderr.strip()}")
        key.chmod(0o400)
        for dev in d.glob("dev/nvidia*"):
            dev.unlink()
        for dev in cfgmod.gpu_device_paths(cfg):
            dev.symlink_to("/dev/null")
        (d / "log" / "jobcomp.log").write_text("")
        cfg.conf_path.write_text(cfgmod.render_slurm_conf(cfg))
        (d / "gres.conf").write_text(cfgmod.render_gres_conf(cfg))
        cgroup = cfgmod.render_cgroup_conf(cfg)
        if cgroup is None:
            (d / "cgroup.conf").unlink(missing_ok=True)
        else:
            (d / "cgroup.conf").write_text(cgroup)
        if cfg.job_firewall:
            settings = cfgmod.render_firewall_settings(cfg, sys.executable)
            (d / firewall_rules.SETTINGS_NAME).write_text(settings)
        base_hosts = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else ""
        plan = cfg.link_plan
        (d / "hosts").write_text(cfgmod.render_hosts(base_hosts, cfg.node_names, plan))
        for name in CLIENTS:
            shim, real = cfg.bin_dir / name, _real_binary(name, cfg)
            shim.unlink(missing_ok=True)
            if plan is not None and real:
                shim.write_text(links.render_client_shim(real, plan.bridge_ns, plan.prefix))
                shim.chmod(0o755)
        (d / "env.sh").write_text(cfgmod.render_env(cfg))
        shim = cfg.bin_dir / "sacct"
        shim.write_text(cfgmod.render_sacct_shim(sys.executable, d))
        shim.chmod(0o755)
        cfg.task_prolog.write_text(cfgmod.render_task_prolog(cfg))
        cfg.task_prolog.chmod(0o755)

    def _make_links(self, cfg: SandboxConfig, state: dict[str, object]) -> None:
        """Create the namespaces, veths and qdiscs (recorded first, so a crash is undone)."""
        plan = cfg.link_plan
        if plan is None:
            return
        stale = links.existing(plan.prefix)
        if stale:
            log.warning("removing leftover namespaces of %s: %s", self.dir, " ".join(stale))
            links.destroy(stale)
        state["netns"] = plan.namespaces
        self._write_state(state)
        links.create(plan)

    def set_node_link(self, node: str, rate: str) -> SandboxConfig:
        """Change one node's link rate on the running sandbox (``slurmtf sandbox link``).

        ``rate`` is a ``--link`` rate; the sandbox's own ``--link`` rate mends the node.
        """
        cfg = self.config()
        if cfg.link_plan is None:
            raise InputError(
                "--dir", str(self.dir), "has no links of its own", "slurmtf sandbox up --link 1gbit"
            )
        index, bps = links.parse_node_link(f"{node}={rate}", cfg.nodes)
        kept = [t for t in cfg.node_link if links.parse_node_link(t, cfg.nodes)[0] != index]
        updated = replace(cfg, node_link=(*kept, f"{node}={rate}"))
        links.reshape_node(cfg.link_plan, index, bps)
        state = self._read_state()
        state["node_link"] = list(updated.node_link)
        self._write_state(state)
        self.cfg = updated
        return updated

    def _recorded_netns(self) -> list[str]:
        raw = self._read_state().get("netns", [])
        return [str(n) for n in raw] if isinstance(raw, list) else []

    def _start_daemons(self, cfg: SandboxConfig, state: dict[str, object], timeout: float) -> None:
        d = cfg.dir
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        env["SLURM_CONF"] = str(cfg.conf_path)
        pids: dict[str, int] = {}
        namespaces: list[str] = []
        state["pids"], state["namespaces"] = pids, namespaces
        deadline = time.monotonic() + timeout

        munge = d / "munge"
        pids["munged"] = daemons.start(
            # --force: a private socket under a 700 parent (pytest's tmp) is only a warning
            ["munged", "-F", "--force", f"--key-file={munge}/munge.key",
             f"--socket={cfg.munge_socket}", f"--pid-file={munge}/munged.pid",
             f"--log-file={d}/log/munged.log", f"--seed-file={munge}/munged.seed"],
            d / "log" / "munged.out", env,
        )  # fmt: skip
        self._write_state(state)
        self._wait(cfg.munge_socket.exists, "munged", deadline, d / "log/munged.log")

        hosts, plan = d / "hosts", cfg.link_plan
        pids["slurmctld"] = daemons.start(
            [cfg.daemon("slurmctld"), "-D", "-c", "-i", "-f", str(cfg.conf_path)],
            d / "log" / "slurmctld.out", env, hosts, plan.bridge_ns if plan else None,
        )  # fmt: skip
        self._write_state(state)
        for i, node in enumerate(cfg.node_names, start=1):
            pids[f"slurmd-{node}"] = daemons.start(
                [cfg.daemon("slurmd"), "-D", "-f", str(cfg.conf_path), "-N", node],
                d / "log" / f"slurmd-{node}.out", env, hosts, plan.node_ns(i) if plan else None,
            )  # fmt: skip
        self._write_state(state)
        time.sleep(0.05)
        for pid in pids.values():
            ns = daemons.mount_ns(pid)
            if ns and ns not in namespaces and ns != daemons.mount_ns(os.getpid()):
                namespaces.append(ns)
        self._write_state(state)

        def all_idle() -> bool:
            self._check_alive(cfg)
            states = self.node_states()
            return len(states) == cfg.nodes and all(s == "idle" for s in states.values())

        self._wait(all_idle, "all nodes idle", deadline, d / "log" / "slurmctld.log")

    def _check_alive(self, cfg: SandboxConfig) -> None:
        for name, pid in self._pids().items():
            daemons.reap(pid)
            if not daemons.alive(pid, str(self.dir)):
                logfile = {"munged": "munged.log", "slurmctld": "slurmctld.log"}.get(
                    name, f"{name}.log"
                )
                out = cfg.dir / "log" / f"{name}.out"
                raise SandboxError(
                    f"{name} (pid {pid}) exited during start-up "
                    f"({daemons.cmdline(pid) or 'gone'}).\n"
                    f"--- {cfg.dir}/log/{logfile}:\n{daemons.log_tail(cfg.dir / 'log' / logfile)}\n"
                    f"--- {out}:\n{daemons.log_tail(out)}"
                )

    def _wait(self, ready: Callable[[], bool], what: str, deadline: float, logfile: Path) -> None:
        while time.monotonic() < deadline:
            if ready():
                return
            if self.cfg is not None:
                self._check_alive(self.cfg)
            time.sleep(0.1)
        raise SandboxError(
            f"timed out waiting for {what}.\n--- {logfile}:\n{daemons.log_tail(logfile)}"
        )

    # ---- down --------------------------------------------------------------
    def cancel_all_jobs(self, timeout: float = 20.0) -> None:
        if "slurmctld" not in self.live_daemons():
            return
        jobs = self.run(["squeue", "-h", "-o", "%A"], timeout=15, check=False).stdout.split()
        if not jobs:
            return
        self.run(["scancel", *jobs], timeout=15, check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = self.run(
                ["squeue", "-h", "-t", "PD,R,CG,S,CF,RQ,SE", "-o", "%A"], timeout=15, check=False
            )
            if done.returncode == 0 and not done.stdout.split():
                return
            time.sleep(0.2)

    def down(self) -> bool:
        """Stop everything this sandbox started; return False if nothing was running."""
        pids = self._pids()
        if not pids:
            return self._remove_links()
        marker = str(self.dir)
        try:
            if self.cfg is None:
                self.cfg = self._config_from_state()
            self.cancel_all_jobs()
        except (SlurmtfError, subprocess.TimeoutExpired) as exc:
            log.warning("could not cancel jobs: %s", exc)
        state = self._read_state()
        raw_ns = state.get("namespaces", [])
        namespaces = {str(n) for n in raw_ns} if isinstance(raw_ns, list) else set()
        live = {name: pid for name, pid in pids.items() if daemons.alive(pid, marker)}
        namespaces |= {daemons.mount_ns(pid) for pid in live.values()}
        slurm = {pid: marker for name, pid in live.items() if name != "munged"}
        daemons.stop(slurm)
        leftovers = daemons.pids_in_namespaces(namespaces, marker=marker)
        daemons.kill_and_wait(leftovers)
        if "munged" in live:
            daemons.stop({live["munged"]: marker})
        state["pids"], state["namespaces"] = {}, []
        self._write_state(state)
        self._remove_links()
        return True

    def _remove_links(self) -> bool:
        """Delete the recorded namespaces and any others with this sandbox's prefix."""
        recorded = self._recorded_netns()
        prefixes = {n.rsplit("-", 1)[0] for n in recorded}
        if self.cfg is not None and self.cfg.link_plan is not None:
            prefixes.add(self.cfg.link_plan.prefix)
        names = list(dict.fromkeys(recorded + [n for p in prefixes for n in links.existing(p)]))
        errors = links.destroy(names)
        if errors:
            log.warning("could not remove namespaces: %s", "; ".join(errors))
        if recorded and self.state_path.exists():
            state = self._read_state()
            state["netns"] = []
            self._write_state(state)
        return bool(names)

    # ---- status ------------------------------------------------------------
    def status(self) -> str:
        pids = self._pids()
        if not pids:
            return f"sandbox {self.dir}: down"
        live = self.live_daemons()
        lines = [f"sandbox {self.dir}: {'up' if len(live) == len(pids) else 'DEGRADED'}"]
        cfg = self._config_from_state()
        if cfg is not None:
            where = cfg.slurm_prefix or "Debian's packages, on PATH"
            lines.append(f"  slurm {cfg.release} ({where})")
            ports = cfg.resv_port_range
            lines.append(
                f"  MpiParams=ports={ports[0]}-{ports[1]} (srun --resv-ports)"
                if ports
                else "  no MpiParams=ports (steps take the resolver's ports)"
            )
            lines.append(f"  {cfg.cpus_per_node} CPUs and {cfg.gpus_per_node} GPUs per node, "
                         f"{cfg.cpu_policy}")  # fmt: skip
        expire = self._read_state().get("cred_expire", cfgmod.DEFAULT_CRED_EXPIRE_S)
        lines.append(f"  cred_expire {expire} s (a requeued job waits this long)")
        netns = self._recorded_netns()
        if netns:
            link = self._read_state().get("link", "")
            own = " ".join(str(n) for n in _as_list(self._read_state().get("node_link")))
            own = f" ({own})" if own else ""
            lines.append(f"  links {link} each way{own}; namespaces {' '.join(netns)}")
        for name, pid in pids.items():
            lines.append(f"  {name:<14} pid {pid:<8} {'running' if name in live else 'GONE'}")
        if "slurmctld" in live:
            lines.append("nodes:")
            lines += [f"  {n} {s}" for n, s in self.node_states().items()]
            jobs = self.run(["squeue", "-h", "-o", "%A %j %T %N"], timeout=15, check=False)
            lines.append(f"jobs: {len(jobs.stdout.splitlines())}")
            lines += ["  " + line for line in jobs.stdout.splitlines()]
        return "\n".join(lines)
