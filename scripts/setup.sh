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
        slurmctld slurmd slurm-client munge iproute2 util-linux procps nftables >/dev/null
fi

# The per-job firewall's tests (tests/test_firewall.py, tests/e2e/test_firewall.py) run nft.
if ! command -v nft >/dev/null && [ "$(id -u)" -eq 0 ]; then
    echo "setup: installing nftables (the per-job firewall's tests)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends nftables >/dev/null \
        || { apt-get update -qq && apt-get install -y -qq --no-install-recommends nftables >/dev/null; }
fi

# The TensorBoard page test (tests/test_tensorboard_e2e.py) drives headless Chromium.
if ! command -v chromium >/dev/null && [ "$(id -u)" -eq 0 ]; then
    echo "setup: installing chromium (the TensorBoard page test)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends chromium >/dev/null \
        || { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
fi

if ! "$PYTHON" -c 'import slurmtf, tensorflow, submitit, hostlist, absl, pytest, xdist, hypothesis, sklearn, mlflow, wandb' 2>/dev/null \
   || ! "$PYTHON" - <<'PY' 2>/dev/null
# What the cpu and dev extras ask for is what is installed (the linters' pins, the
# TensorFlow dependencies' exclusions), not only importable.
import importlib.metadata, tomllib
from packaging.requirements import Requirement
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
for line in extras["cpu"] + extras["dev"]:
    wanted = Requirement(line)
    assert wanted.specifier.contains(importlib.metadata.version(wanted.name), prereleases=True)
PY
then
    echo "setup: installing slurmtf with the CPU TensorFlow wheel and dev tools"
    "$PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
        -e ".[cpu,dev]"
fi

if ! "$PYTHON" -c 'import tensorboard' 2>/dev/null; then
    echo "setup: installing tensorboard (the Keras TensorBoard callback tests)"
    "$PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
        "tensorboard>=2.15"
fi
# tf_keras (the keras2 extra) for the tf.keras tests: --no-deps, or pip would pull the full
# `tensorflow` wheel next to tensorflow-cpu.
if ! "$PYTHON" -c 'import tf_keras' 2>/dev/null; then
    echo "setup: installing tf-keras (no dependencies: TensorFlow is already here)"
    "$PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
        --no-deps "tf-keras==2.21.0"
fi
