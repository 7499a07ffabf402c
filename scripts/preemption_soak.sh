#!/usr/bin/env bash
# Preemption soak: the full 10-moment version of tests/e2e/test_preemption.py.
#
#   scripts/preemption_soak.sh [COUNT]          # default 10 moments
#   SLURMTF_PREEMPT_SEED=7 scripts/preemption_soak.sh
#
# Brings up the local Slurm sandbox (through the test fixture), runs one uninterrupted
# two-node MNIST job and COUNT preempted ones, alternately by USR2 (save, exit 75, the
# job script requeues) and by `scontrol requeue` (hard kill, resume from the last periodic
# checkpoint), each at a random step. Every run must end at the same step with the same
# weights as the uninterrupted one, from a complete checkpoint, redoing at most one
# checkpoint interval. The seed is printed so that a failure can be replayed.
# Takes about 40-60 s per moment on 2 cores. Needs root (the sandbox), like the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
export SLURMTF_PREEMPTIONS="${1:-10}"
export SLURMTF_PREEMPT_SEED="${SLURMTF_PREEMPT_SEED:-$RANDOM}"
export SLURMTF_STRICT_PREREQS=1
echo "preemption soak: $SLURMTF_PREEMPTIONS moments, SLURMTF_PREEMPT_SEED=$SLURMTF_PREEMPT_SEED"
start=$(date +%s)
status=0
"$PYTHON" -m pytest tests/e2e/test_preemption.py -p no:cacheprovider -s -q -rA || status=$?
echo "preemption soak: exit $status after $(( $(date +%s) - start )) s (seed $SLURMTF_PREEMPT_SEED)"
exit "$status"
