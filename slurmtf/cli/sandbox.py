"""``slurmtf sandbox up|status|down|env``: argparse front end of :class:`Sandbox`."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurmtf.cli import ArgumentParser, add_flag, run_command
from slurmtf.errors import InputError
from slurmtf.sandbox import config as cfgmod
from slurmtf.sandbox.core import PREFIX_VARIABLE, Sandbox, default_dir, default_slurm_prefix


class _Parser(ArgumentParser):
    """Operands (``link NODE RATE``) may follow the flags: ``link --dir D node3 1gbit``."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        return self.parse_intermixed_args(args, namespace)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="slurmtf sandbox",
        description="A local multi-node Slurm cluster (munged, slurmctld, N slurmd) "
        "with fake GPUs, all state in one directory.",
        epilog='Then: eval "$(slurmtf sandbox env)"; sbatch jobs/mnist.sbatch (in a checkout) '
        "or sbatch mnist.sbatch (after slurmtf job-scripts .)",
    )
    parser.add_argument(
        "command",
        choices=["up", "status", "down", "env", "link"],
        help="what to do with the sandbox; `link NODE RATE` changes one node's link rate on "
        "a running sandbox (e.g. link node3 100mbit; the --link rate mends it)",
    )
    parser.add_argument("operands", nargs="*", metavar="NODE RATE", help="for `link` only")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help=f"state directory (default $SLURMTF_SANDBOX_DIR or {default_dir()})",
    )
    parser.add_argument("--nodes", type=int, default=3, help="number of nodes (default 3)")
    add_flag(
        parser,
        "gpus_per_node",
        type=int,
        default=2,
        help="fake GPUs per node (default 2; 0 = none)",
    )
    parser.add_argument(
        "--slurm",
        default=None,
        metavar="PREFIX",
        help="run the Slurm build installed in PREFIX (daemons and every client command: "
        "scripts/build-slurm.sh TARBALL prints it), e.g. /opt/slurm-26.05.3 "
        f"(default ${PREFIX_VARIABLE}, else Debian's packaged Slurm)",
    )
    add_flag(
        parser,
        "no_resv_ports",
        action="store_true",
        help="leave MpiParams=ports out of slurm.conf: srun --resv-ports then reserves "
        "nothing and jobs take the resolver's ports (by default the sandbox reserves ports "
        "per step, as sites that set MpiParams do; --job_firewall implies this flag)",
    )
    _add_cpu_flags(parser)
    _add_link_flags(parser)
    return parser


def _add_cpu_flags(parser: argparse.ArgumentParser) -> None:
    """How the nodes hand out CPUs, as a site's slurm.conf says it."""
    add_flag(
        parser,
        "cpus_per_node",
        type=int,
        default=cfgmod.DEFAULT_CPUS_PER_NODE,
        metavar="N",
        help=f"CPUs each node offers (default {cfgmod.DEFAULT_CPUS_PER_NODE}; the nodes may "
        "claim more than the machine has)",
    )
    add_flag(
        parser,
        "threads_per_core",
        type=int,
        default=1,
        metavar="T",
        help="hardware threads of each core (default 1; 2: hyperthreaded nodes, where "
        "CR_Core gives a job whole cores)",
    )
    add_flag(
        parser,
        "select_type_parameters",
        default="CR_Core",
        metavar="|".join(cfgmod.SELECT_TYPE_PARAMETERS),
        help="SelectTypeParameters: count the nodes' CPUs by core (CR_Core, the default, "
        "as most sites) or by CPU (CR_CPU)",
    )
    add_flag(
        parser,
        "def_cpu_per_gpu",
        type=int,
        default=0,
        metavar="N",
        help="DefCpuPerGPU=N: CPUs a job gets per allocated GPU when it asks none itself, "
        "as some sites set it (default 0: unset, as many sites leave it; a job then gets "
        "one CPU per task)",
    )


def _add_link_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that give nodes links of their own (and the firewall that needs them)."""
    parser.add_argument(
        "--link",
        default="",
        metavar="RATE",
        help="give every node its own network namespace and a link of RATE each way to a "
        "bridge (tc token bucket), e.g. 1gbit, 2.5gbit, 10gbit; `unshaped` for namespaces "
        "without a cap (default: all nodes share loopback)",
    )
    add_flag(
        parser,
        "node_link",
        action="append",
        default=[],
        metavar="NODE=RATE",
        help="give one node its own link rate, e.g. node3=100mbit (a bad node; repeat or "
        "comma-separate for several; needs --link)",
    )
    add_flag(
        parser,
        "cred_expire",
        default=str(cfgmod.DEFAULT_CRED_EXPIRE_S),
        metavar="SECONDS",
        help="munge credential lifetime, which is also how long a requeued job waits before "
        f"it may start again (default {cfgmod.DEFAULT_CRED_EXPIRE_S}: fast requeues; "
        f"{cfgmod.SLURM_CRED_EXPIRE_S} is Slurm's default, what a real cluster costs)",
    )
    add_flag(
        parser,
        "job_firewall",
        action="store_true",
        help="run slurmtf's per-job firewall as the nodes' Prolog/Epilog: a job's worker "
        "ports are reachable only from its own nodes (needs --link; docs/SECURITY.md)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_command("slurmtf sandbox", _parser(), argv, _run)


def _run(args: argparse.Namespace) -> int:
    node_link = tuple(t for arg in args.node_link for t in arg.split(",") if t.strip())
    if args.operands and args.command != "link":
        raise InputError(
            args.command, " ".join(args.operands), "takes no operands", "slurmtf sandbox --help"
        )
    if args.command == "link":
        return _link(Sandbox(args.dir or default_dir()), args.operands)
    sandbox = Sandbox(
        args.dir or default_dir(),
        args.nodes,
        args.gpus_per_node,
        link=args.link,
        job_firewall=args.job_firewall,
        node_link=node_link,
        cred_expire=cfgmod.parse_cred_expire(args.cred_expire),
        slurm=default_slurm_prefix() if args.slurm is None else args.slurm,
        resv_ports=not args.no_resv_ports,
        cpus_per_node=args.cpus_per_node,
        threads_per_core=args.threads_per_core,
        select_type_parameters=args.select_type_parameters,
        def_cpu_per_gpu=args.def_cpu_per_gpu,
    )
    if args.command == "up":
        _up(sandbox, node_link)
    elif args.command == "down":
        stopped = sandbox.down()
        print(f"sandbox {'stopped' if stopped else 'was not running'}: {sandbox.dir}")
    elif args.command == "status":
        print(sandbox.status())
        return 0 if sandbox.is_up() else 3
    else:
        print(cfgmod.render_env(sandbox.config()), end="")
    return 0


# What `up` cannot change on a running sandbox (`down` first).
_FIXED_WHEN_UP = {
    "nodes": "--nodes", "gpus_per_node": "--gpus_per_node", "link": "--link",
    "cred_expire": "--cred_expire", "slurm_prefix": "--slurm", "resv_ports": "--no_resv_ports",
    "cpus_per_node": "--cpus_per_node", "threads_per_core": "--threads_per_core",
    "select_type_parameters": "--select_type_parameters", "def_cpu_per_gpu": "--def_cpu_per_gpu",
}  # fmt: skip


def _up(sandbox: Sandbox, node_link: tuple[str, ...]) -> None:
    t0 = time.monotonic()
    started = sandbox.up()
    cfg = sandbox.config()
    if started:
        took = time.monotonic() - t0
        names = ", ".join(cfg.node_names)
        link = f", links {cfg.link} each way" if cfg.link else ""
        link += f" ({', '.join(cfg.node_link)})" if cfg.node_link else ""
        link += ", per-job firewall" if cfg.job_firewall else ""
        link += f", {cfg.cpu_policy}, cred_expire {cfg.cred_expire} s, Slurm {cfg.release}"
        link += f" from {cfg.slurm_prefix}" if cfg.slurm_prefix else ""
        print(f"sandbox up in {took:.1f}s: {cfg.nodes} nodes ({names}), "
              f"{cfg.gpus_per_node} fake GPUs each, cluster {cfg.cluster_name}{link}",
              file=sys.stderr)  # fmt: skip
    else:
        print(f"sandbox already up in {sandbox.dir} ({cfg.nodes} nodes, "
              f"{cfg.gpus_per_node} GPUs each)", file=sys.stderr)  # fmt: skip
        wanted = sandbox.settings()
        changed = [flag for name, flag in _FIXED_WHEN_UP.items()
                   if getattr(wanted, name) != getattr(cfg, name)]  # fmt: skip
        if changed:
            print(f"HINT: `slurmtf sandbox down` first to change {', '.join(changed)}",
                  file=sys.stderr)  # fmt: skip
        elif node_link and node_link != cfg.node_link:
            print("HINT: `slurmtf sandbox link NODE RATE` changes one node's rate",
                  file=sys.stderr)  # fmt: skip
    print(f"HINT: eval the lines below, or: source {sandbox.dir}/env.sh", file=sys.stderr)
    print(cfgmod.render_env(cfg), end="")


def _link(sandbox: Sandbox, operands: list[str]) -> int:
    if len(operands) != 2:
        raise InputError(
            "link", " ".join(operands), "needs NODE RATE", "slurmtf sandbox link node3 100mbit"
        )
    cfg = sandbox.set_node_link(*operands)
    print(f"{operands[0]}: link {operands[1]} each way (others {cfg.link}) in {sandbox.dir}")
    return 0
