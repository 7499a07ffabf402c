#!/usr/bin/env bash
# The version matrix, on two axes: Slurm releases and TensorFlow releases.
#
#   SLURMTF_SLURM_MATRIX=/opt/slurm-26.05.3,../shared/slurm/slurm-25.11.7.tar.xz,debian \
#   SLURMTF_TF_MATRIX=2.15,2.17 \
#       bash scripts/matrix.sh [PYTEST ARGS...]
#
# A Slurm entry is a build's install prefix, a release tarball (built first, or its earlier
# build reused: scripts/build-slurm.sh), or `debian` for Debian's packaged Slurm (what the
# rest of the suite runs on; the default when only SLURMTF_TF_MATRIX is set).
# A TensorFlow entry is a tested release or its series (`python3 -m slurmtf.tf.releases
# list`), run from its own virtual environment (built first, or reused:
# scripts/tf-venv.sh), whose interpreter runs pytest, the supervisors and every rank; or
# `installed` (the default), this interpreter's own TensorFlow.
# Each pair runs the core of the end-to-end tier (`-m matrix`); a TensorFlow release also
# runs its TensorFlow tier (`-m "(tf or matrix) and not readme"`: the README's commands run
# once, in the suite, on the default install; the tiers cover their paths on each release).
# SLURMTF_TF_SELECTION replaces that selection: CI's `matrix or tf_core` is the core of
# both tiers, what every release must run, in a quarter of the time. Prints one line per
# pair and exits non-zero when any failed; a selection that runs no test fails too.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

if [ -z "${SLURMTF_SLURM_MATRIX:-}" ] && [ -z "${SLURMTF_TF_MATRIX:-}" ]; then
    echo "matrix: SLURMTF_SLURM_MATRIX and SLURMTF_TF_MATRIX are empty" >&2
    echo "HINT: SLURMTF_SLURM_MATRIX=/opt/slurm-26.05.3 (a prefix of scripts/build-slurm.sh)," \
         "a release tarball, or debian; SLURMTF_TF_MATRIX=2.15,2.21 (TensorFlow releases);" \
         "comma-separated for several" >&2
    exit 2
fi

trim() { local s="$1"; s="${s#"${s%%[![:space:]]*}"}"; printf '%s' "${s%"${s##*[![:space:]]}"}"; }

slurm_prefix() {  # a Slurm entry -> its prefix ("" for Debian's)
    case "$1" in
        debian) echo "" ;;
        *.tar|*.tar.*) bash scripts/build-slurm.sh "$1" | tail -n 1 ;;
        /*)
            if [ ! -x "$1/sbin/slurmctld" ]; then
                echo "matrix: $1 holds no Slurm build (no sbin/slurmctld)." \
                     "HINT: bash scripts/build-slurm.sh TARBALL $1" >&2
                exit 2
            fi
            echo "$1" ;;
        *)
            echo "matrix: SLURMTF_SLURM_MATRIX entry '$1' is neither a prefix, a tarball" \
                 "nor debian. HINT: use an absolute prefix such as /opt/slurm-26.05.3" >&2
            exit 2 ;;
    esac
}

IFS=',' read -r -a slurms <<<"${SLURMTF_SLURM_MATRIX:-debian}"
IFS=',' read -r -a tfs <<<"${SLURMTF_TF_MATRIX:-installed}"
summary=()
failed=0
for slurm in "${slurms[@]}"; do
    slurm="$(trim "$slurm")"
    [ -n "$slurm" ] || continue
    prefix="$(slurm_prefix "$slurm")"
    if [ -n "$prefix" ]; then
        release="$("$prefix/sbin/slurmctld" -V)"
    else
        release="$(slurmctld -V 2>/dev/null || echo 'slurm (Debian, not installed yet)')"
    fi
    for tf in "${tfs[@]}"; do
        tf="$(trim "$tf")"
        [ -n "$tf" ] || continue
        python="$PYTHON"
        selection="matrix"
        path="$PATH"
        if [ "$tf" != installed ]; then
            venv="$(bash scripts/tf-venv.sh "$tf" | tail -n 1)"
            python="$venv/bin/python"
            selection="${SLURMTF_TF_SELECTION:-(tf or matrix) and not readme}"
            path="$venv/bin:$PATH"  # python3 on the ranks, as a loaded module puts it first
        fi
        tf_release="tensorflow $("$python" -c \
            'import importlib.metadata as m, sys
for n in ("tensorflow", "tensorflow-cpu", "tf-nightly"):
    try: print(m.version(n)); sys.exit()
    except m.PackageNotFoundError: pass
print("(none)")')"
        echo "== matrix: $release${prefix:+ from $prefix}, $tf_release ($python): -m \"$selection\""
        start=$SECONDS
        status=0
        PATH="$path" PYTHON="$python" SLURMTF_SLURM_PREFIX="$prefix" SLURMTF_STRICT_PREREQS=1 \
            "$python" -m pytest -m "$selection" -p no:cacheprovider "$@" || status=$?
        took=$((SECONDS - start))
        pair="$release, $tf_release"
        case "$status" in
            0) summary+=("PASS  $pair  ${took} s") ;;
            5) summary+=("FAIL  $pair  no test selected (-m \"$selection\")"); failed=1 ;;
            *) summary+=("FAIL  $pair  pytest exit $status, ${took} s"); failed=1 ;;
        esac
    done
done
echo "== matrix summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
