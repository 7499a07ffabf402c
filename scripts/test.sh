#!/usr/bin/env bash
# The whole test suite on a fresh machine: install, lint, type-check, unit and
# end-to-end tests (a local Slurm sandbox is started and stopped by the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PYTHON="${PYTHON:-python3}"

echo "== ruff"
"$PYTHON" -m ruff check .
"$PYTHON" -m ruff format --check .
echo "== mypy"
"$PYTHON" -m mypy
echo "== pytest"
# Every prerequisite is installed above, so a missing one is a failure, not a skip.
export SLURMTF_STRICT_PREREQS=1
status=0
"$PYTHON" -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: failing" >&2
fi
exit "$status"
