#!/usr/bin/env bash
# Install everything slurmtf, its models and its tests need on a fresh Debian-like
# machine (root, Python 3.10+). Idempotent: already-installed parts are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null || ! command -v sbatch >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: Slurm/munge are missing and installing them needs root." >&2
        echo "HINT: run as root, or: apt-get install slurmctld slurmd slurm-client munge" >&2
        exit 1
    fi
    echo "setup: installing Slurm and munge (Debian packages)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends \
        slurmctld slurmd slurm-client munge iproute2 util-linux procps >/dev/null
fi

if ! "$PYTHON" -c 'import slurmtf, tensorflow, submitit, hostlist, absl, pytest, hypothesis' 2>/dev/null \
   || ! "$PYTHON" -m ruff --version >/dev/null 2>&1 || ! "$PYTHON" -m mypy --version >/dev/null 2>&1; then
    echo "setup: installing slurmtf with the CPU TensorFlow wheel and dev tools"
    "$PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
        -e ".[cpu,dev]"
fi
