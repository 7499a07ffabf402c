#!/bin/sh
# slurmtf per-job firewall: the Slurm node prolog, and the epilog as epilog.sh (a link to
# this file; the action is the name it is run by). `slurmtf firewall --print-config`.
# slurmd gives no PATH. The interpreter is `python = ...` in slurmtf-firewall.conf
# beside slurm.conf (one with slurmtf's dependencies; default python3); the package
# run is the one this script belongs to. Always exit 0: a failing prolog or epilog drains
# the node.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
conf=$(dirname -- "${SLURM_CONF:-/etc/slurm/slurm.conf}")/slurmtf-firewall.conf
python=$(sed -n 's/^[[:space:]]*python[[:space:]]*=[[:space:]]*\([^#[:space:]]*\).*/\1/p' \
  "$conf" 2>/dev/null | tail -n 1)
action=$(basename -- "$0" .sh)
case "$action" in prolog|epilog) ;; *) echo "slurmtf firewall: NOT done: run as prolog.sh or epilog.sh, not $0" >&2; exit 0 ;; esac
PYTHONPATH=${here%/slurmtf/firewall} "${python:-python3}" -m slurmtf.firewall "$action"
exit 0
