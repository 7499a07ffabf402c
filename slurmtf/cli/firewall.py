"""``slurmtf firewall --print-config``: how to install the per-job firewall."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from slurmtf.cli import ArgumentParser, add_flag, run_command
from slurmtf.firewall import EPILOG, PROLOG, rules


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="slurmtf firewall",
        description="A Slurm node prolog/epilog pair that lets only a job's own nodes reach "
        "its TensorFlow worker ports (one nftables table per job). See docs/SECURITY.md.",
    )
    add_flag(
        parser,
        "print_config",
        action="store_true",
        help="print where the scripts are, the slurm.conf lines and the settings file",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_command("slurmtf firewall", _parser(), argv, _run)


def _run(args: argparse.Namespace) -> int:
    if not args.print_config:
        _parser().print_help()
        return 0
    print(f"# prolog: {PROLOG}\n# epilog: {EPILOG}")
    print("# slurm.conf on every node (keep PrologFlags you have; add Alloc):")
    print("\n".join(rules.slurm_conf_lines(str(PROLOG), str(EPILOG))))
    print(f"# {rules.SETTINGS_NAME} beside slurm.conf on every node:")
    print(rules.render_settings(sys.executable), end="")
    return 0
