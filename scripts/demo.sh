#!/usr/bin/env bash
# The main job on the embedded default: set everything up on a fresh machine, start a
# local 2-node Slurm sandbox, train MNIST across both nodes with python -m slurmtf.submit,
# wait, print the final accuracy and the per-rank logs, and stop the sandbox again
# (KEEP_SANDBOX=1 leaves it running for more jobs).
#
# Extra arguments go to the model, e.g.: bash scripts/demo.sh --train_steps=400
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PYTHON="${PYTHON:-python3}"
SANDBOX_DIR="${SLURMTF_SANDBOX_DIR:-/tmp/slurmtf-sandbox}"
LOG_DIR="${LOG_DIR:-$PWD/runs/demo-$(date +%Y%m%d-%H%M%S)}"

"$PYTHON" -m slurmtf.sandbox up --dir "$SANDBOX_DIR" --nodes 2 --gpus-per-node 0
if [ "${KEEP_SANDBOX:-0}" != 1 ]; then
    trap '"$PYTHON" -m slurmtf.sandbox down --dir "$SANDBOX_DIR"' EXIT
fi
eval "$("$PYTHON" -m slurmtf.sandbox env --dir "$SANDBOX_DIR")"

"$PYTHON" -m slurmtf.submit --model=mnist --nodes=2 --time=15 --job_name=mnist-demo \
    --log_dir="$LOG_DIR" --wait -- \
    --model_dir="$LOG_DIR/model" --export_dir="$LOG_DIR/export" \
    --train_steps=300 --epochs_between_evals=1 "$@"
