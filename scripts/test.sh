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
# Its cache outside the checkout: in a fresh clone (CI's) mypy reads what an earlier run
# checked and checks only what changed, instead of every module and its dependencies anew.
"$PYTHON" -m mypy --cache-dir "${SLURMTF_MYPY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slurmtf/mypy}"
# The oldest TensorFlow's environment for the version matrix below, built (or reused) before
# the suite, whose tests/test_tf_venv.py checks its reuse.
if [ -z "${SLURMTF_TF_MATRIX+set}" ]; then
    releases="$("$PYTHON" -m slurmtf.tf.releases list)"  # no pipe: a closed one fails the run
    SLURMTF_TF_MATRIX="${releases%%$'\n'*}"
    export SLURMTF_TF_MATRIX
fi
IFS=',' read -r -a tf_releases <<<"${SLURMTF_TF_MATRIX:-}"
for release in "${tf_releases[@]}"; do
    [ "$release" = installed ] || bash scripts/tf-venv.sh "$release" >/dev/null
done

# The version matrix: the core of the end-to-end tier again on SchedMD's current release
# (the suite uses Debian's 22.05), built from its tarball or reused, with the oldest
# TensorFlow slurmtf supports in a venv of its own (the suite uses the newest): on the
# TensorFlow axis the core of both tiers (`matrix or tf_core`): every path and feature each
# release must run; the whole TensorFlow tier of every release is `SLURMTF_TF_MATRIX=2.15,...
# bash scripts/matrix.sh` (docs/SLURM_VERSIONS.md, docs/TENSORFLOW_VERSIONS.md).
# SLURMTF_SLURM_MATRIX names other builds, tarballs or `debian`, SLURMTF_TF_MATRIX other
# TensorFlow releases (`installed`: this interpreter's); empty (`=`) skips that axis.
# It runs beside the suite, on sandboxes of its own: most of both is waiting on Slurm and on
# timeouts, so side by side they end in the time of the longer, under CI's limit.
matrix_pid=""
if [ $# -eq 0 ]; then
    default_tarball="${SLURMTF_SLURM_TARBALL:-../shared/slurm/slurm-26.05.3.tar.xz}"
    if [ -z "${SLURMTF_SLURM_MATRIX+set}" ]; then
        if [ -f "$default_tarball" ]; then
            export SLURMTF_SLURM_MATRIX="$default_tarball"
        elif [ "${CI:-}" = "true" ]; then
            echo "no Slurm tarball at $default_tarball for the version matrix: failing" >&2
            echo "HINT: set SLURMTF_SLURM_TARBALL (SchedMD's download page) or SLURMTF_SLURM_MATRIX" >&2
            exit 1
        else
            echo "== Slurm axis of the matrix skipped: no Slurm tarball at $default_tarball" \
                 "(set SLURMTF_SLURM_TARBALL or SLURMTF_SLURM_MATRIX)" >&2
        fi
    fi
    IFS=',' read -r -a slurm_entries <<<"${SLURMTF_SLURM_MATRIX:-}"
    for entry in "${slurm_entries[@]}"; do  # built (or reused) before the suite starts
        case "$entry" in *.tar|*.tar.*) bash scripts/build-slurm.sh "$entry" >/dev/null ;; esac
    done
    if [ -n "${SLURMTF_SLURM_MATRIX:-}${SLURMTF_TF_MATRIX:-}" ]; then
        matrix_log="$(mktemp -t slurmtf-matrix.XXXXXX)"
        echo "== matrix (beside the suite; its output follows the suite's): $matrix_log"
        SLURMTF_TF_SELECTION="${SLURMTF_TF_SELECTION:-matrix or tf_core}" \
            bash scripts/matrix.sh --durations=10 >"$matrix_log" 2>&1 &
        matrix_pid=$!
    fi
fi

echo "== pytest"
# Every prerequisite is installed above, so a missing one is a failure, not a skip.
export SLURMTF_STRICT_PREREQS=1
# SLURMTF_TEST_WORKERS=N runs the suite's modules side by side on N pytest-xdist workers
# (most of an end-to-end module is waiting on Slurm and on timeouts). Each worker has
# sandboxes of its own; a module stays on one worker (--dist loadfile), so that what it
# shares starts once. 2 by default (0: one process, as before; docs/TESTING.md).
workers="${SLURMTF_TEST_WORKERS:-2}"
parallel=()
# --no-loadscope-reorder: the modules come longest first (tests/conftest.py, from
# tests/module_seconds.json), not by their number of tests.
[ "$workers" = 0 ] || parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
status=0
"$PYTHON" -m pytest "${parallel[@]}" --durations="${SLURMTF_TEST_DURATIONS:-25}" "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: failing" >&2
fi
if [ -n "$matrix_pid" ]; then
    matrix_status=0
    wait "$matrix_pid" || matrix_status=$?
    cat "$matrix_log"
    rm -f "$matrix_log"
    [ "$status" -ne 0 ] || status=$matrix_status
fi
exit "$status"
