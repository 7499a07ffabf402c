#!/usr/bin/env bash
# The version matrix: the core of the end-to-end tier (`pytest -m matrix`) on each Slurm
# named in SLURMTF_SLURM_MATRIX, one after the other, each on sandboxes of its own.
#
#   SLURMTF_SLURM_MATRIX=/opt/slurm-26.05.3,../shared/slurm/slurm-25.11.7.tar.xz,debian \
#       bash scripts/matrix.sh [PYTEST ARGS...]
#
# An entry is a Slurm build's install prefix, a release tarball (built first, or its
# earlier build reused: scripts/build-slurm.sh), or `debian` for Debian's packaged Slurm
# (what the rest of the suite runs on). Prints one line per Slurm and exits non-zero when
# any failed; a selection that runs no test fails too.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

if [ -z "${SLURMTF_SLURM_MATRIX:-}" ]; then
    echo "matrix: SLURMTF_SLURM_MATRIX is empty" >&2
    echo "HINT: SLURMTF_SLURM_MATRIX=/opt/slurm-26.05.3 (a prefix of scripts/build-slurm.sh)," \
         "a release tarball, or debian; comma-separated for several" >&2
    exit 2
fi

IFS=',' read -r -a entries <<<"$SLURMTF_SLURM_MATRIX"
summary=()
failed=0
for entry in "${entries[@]}"; do
    entry="${entry#"${entry%%[![:space:]]*}"}"
    entry="${entry%"${entry##*[![:space:]]}"}"
    [ -n "$entry" ] || continue
    case "$entry" in
        debian) prefix="" ;;
        *.tar|*.tar.*) prefix="$(bash scripts/build-slurm.sh "$entry" | tail -n 1)" ;;
        /*) prefix="$entry" ;;
        *)
            echo "matrix: SLURMTF_SLURM_MATRIX entry '$entry' is neither a prefix, a tarball" \
                 "nor debian. HINT: use an absolute prefix such as /opt/slurm-26.05.3" >&2
            exit 2 ;;
    esac
    if [ -n "$prefix" ] && [ ! -x "$prefix/sbin/slurmctld" ]; then
        echo "matrix: $prefix holds no Slurm build (no sbin/slurmctld)." \
             "HINT: bash scripts/build-slurm.sh TARBALL $prefix" >&2
        exit 2
    fi
    if [ -n "$prefix" ]; then
        release="$("$prefix/sbin/slurmctld" -V)"
    else
        release="$(slurmctld -V 2>/dev/null || echo 'slurm (Debian, not installed yet)')"
    fi
    echo "== matrix: $release${prefix:+ from $prefix}"
    start=$SECONDS
    status=0
    SLURMTF_SLURM_PREFIX="$prefix" SLURMTF_STRICT_PREREQS=1 \
        "$PYTHON" -m pytest -m matrix -p no:cacheprovider "$@" || status=$?
    took=$((SECONDS - start))
    case "$status" in
        0) summary+=("PASS  $release  ${took} s") ;;
        5) summary+=("FAIL  $release  no test selected (-m matrix)"); failed=1 ;;
        *) summary+=("FAIL  $release  pytest exit $status, ${took} s"); failed=1 ;;
    esac
done
echo "== matrix summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
