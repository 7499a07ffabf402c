#!/usr/bin/env bash
# The main job on the embedded default: set everything up on a fresh machine, write a
# small REAL data set (1,797 handwritten digits of the UCI collection that scikit-learn
# ships, as MNIST IDX files with checksums), start a local 2-node Slurm sandbox, train
# MNIST on it across both nodes with python -m slurmtf.submit, wait, stop the sandbox
# (KEEP_SANDBOX=1 leaves it running for more jobs) and end with the held-out accuracy
# from the chief's eval event and where the data came from.
#
# Extra arguments go to the model, e.g.: bash scripts/demo.sh --train_steps=460
# DATA_DIR=/path/to/full/mnist trains on that instead (see `slurmtf data fetch`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PYTHON="${PYTHON:-python3}"
SANDBOX_DIR="${SLURMTF_SANDBOX_DIR:-/tmp/slurmtf-sandbox}"
LOG_DIR="${LOG_DIR:-$PWD/runs/demo-$(date +%Y%m%d-%H%M%S)}"
DATA_DIR="${DATA_DIR:-$PWD/runs/data/mnist-sample}"

if [ ! -f "$DATA_DIR/MANIFEST.json" ]; then
    "$PYTHON" -m slurmtf.datasets sample-mnist "$DATA_DIR"
fi
"$PYTHON" -m slurmtf.sandbox up --dir "$SANDBOX_DIR" --nodes 2 --gpus_per_node 0
if [ "${KEEP_SANDBOX:-0}" != 1 ]; then
    trap '"$PYTHON" -m slurmtf.sandbox down --dir "$SANDBOX_DIR"' EXIT
fi
eval "$("$PYTHON" -m slurmtf.sandbox env --dir "$SANDBOX_DIR")"

# 1,437 training digits: 23 steps of 60 per epoch; 10 epochs, evaluated every 2.
status=0
"$PYTHON" -m slurmtf.submit --model=mnist --nodes=2 --time=15 --job_name=mnist-demo \
    --log_dir="$LOG_DIR" --wait -- \
    --data_dir="$DATA_DIR" --model_dir="$LOG_DIR/model" --export_dir="$LOG_DIR/export" \
    --batch_size=60 --learning_rate=0.004 --train_steps=230 --epochs_between_evals=2 \
    "$@" || status=$?
if [ "${KEEP_SANDBOX:-0}" != 1 ]; then
    trap - EXIT
    "$PYTHON" -m slurmtf.sandbox down --dir "$SANDBOX_DIR"
fi
[ "$status" -eq 0 ] || exit "$status"

"$PYTHON" - "$LOG_DIR" "$DATA_DIR" <<'PY'
import sys
from pathlib import Path

from slurmtf.datasets import manifest
from slurmtf.events import named, read_events

log_dir, data_dir = Path(sys.argv[1]), sys.argv[2]
chief = sorted(log_dir.glob("*_0_log.out"), key=lambda p: p.stat().st_mtime)[-1]
found = named(read_events(chief), "eval")
if not found:
    sys.exit(f"demo: no eval event in {chief}")
last = found[-1]
workers = next((e["num_workers"] for e in named(read_events(chief), "cluster")), "?")
print(
    f"demo: held-out accuracy {last['accuracy']:.4f} on {last['examples']} digits the model "
    f"never trained on (step {last['step']}, {workers} workers; the chief's eval event in "
    f"{chief})"
)
if (Path(data_dir) / manifest.NAME).is_file():
    record = manifest.verify_directory(data_dir)
    print(f"demo: data from {data_dir} ({len(record['files'])} files, SHA-256 verified): "
          f"{manifest.describe(record)}")
else:
    print(f"demo: data from {data_dir} (no {manifest.NAME}: not checksummed)")
PY
