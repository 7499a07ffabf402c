#!/usr/bin/env bash
# A virtual environment with one TensorFlow release as a site's module carries it, for the
# TensorFlow release matrix (scripts/tf-matrix.sh) and for trying a release by hand.
#
#   bash scripts/tf-venv.sh VERSION [PREFIX]
#
# VERSION is a tested release or its series (2.16.2, 2.16; `python3 -m slurmtf.tf.releases
# list`). The environment gets tensorflow-cpu, the Keras of its time and the numpy it needs
# (slurmtf/tf/releases.py), tf-keras without dependencies, the test tools, and this
# checkout of slurmtf (editable). PREFIX defaults to /opt/tensorflow-X.Y.Z
# (SLURMTF_TF_ROOT changes /opt). A stamp records the pins: a second call with the same
# pins reuses the environment in well under a second (relinking the checkout when another
# checkout calls it). The last line printed is PREFIX.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

usage() {
    echo "usage: bash scripts/tf-venv.sh VERSION [PREFIX]" >&2
    echo "HINT: VERSION is one of: $("$PYTHON" -m slurmtf.tf.releases list | tr '\n' ' ')" >&2
    exit 2
}
[ $# -ge 1 ] && [ $# -le 2 ] || usage
case "$1" in -h|--help) usage ;; esac

pins="$("$PYTHON" -m slurmtf.tf.releases pins "$1")" || usage
version="$(printf '%s\n' "$pins" | sed -n 's/^tensorflow-cpu==//p')"
prefix="${2:-${SLURMTF_TF_ROOT:-/opt}/tensorflow-$version}"
checkout="$(pwd -P)"
mapfile -t requirements < <(printf '%s\n' "$pins" | grep -v '^tf-keras==')
tf_keras="$(printf '%s\n' "$pins" | grep '^tf-keras==')"
# The test tools (pyproject's dev extra without the linters, which run once, outside).
tools=("pytest>=8" "hypothesis>=6.100" "scikit-learn>=1.3" "matplotlib>=3.8" "tensorboard")
stamp_text="$(printf '%s ' "${requirements[@]}" "$tf_keras" "${tools[@]}") $("$PYTHON" -V 2>&1)"
stamp="$prefix/.slurmtf-venv"
pip=("$prefix/bin/python" -m pip install -q --disable-pip-version-check --root-user-action=ignore)

link_checkout() {
    # slurmtf itself, editable from this checkout (no dependencies: they are pinned above).
    if [ "$(cat "$prefix/.slurmtf-checkout" 2>/dev/null)" != "$checkout" ]; then
        "${pip[@]}" --no-deps --no-build-isolation -e "$checkout" >&2
        echo "$checkout" >"$prefix/.slurmtf-checkout"
    fi
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_text" ] && [ -x "$prefix/bin/python" ]; then
    link_checkout
    echo "tf-venv: $prefix already holds TensorFlow $version" >&2
    echo "$prefix"
    exit 0
fi

start=$SECONDS
echo "tf-venv: TensorFlow $version into $prefix (${requirements[*]})" >&2
rm -rf -- "$prefix"
"$PYTHON" -m venv "$prefix"
"${pip[@]}" "${requirements[@]}" "${tools[@]}" "absl-py>=2.0" "python-hostlist>=1.23" \
    "submitit>=1.5" "setuptools>=68" >&2
# tf-keras names the full `tensorflow` wheel as its dependency: never beside tensorflow-cpu.
"${pip[@]}" --no-deps "$tf_keras" >&2
"${pip[@]}" --no-deps --no-build-isolation -e "$checkout" >&2
echo "$checkout" >"$prefix/.slurmtf-checkout"
"$prefix/bin/python" - "$version" <<'PY' >&2
import importlib.metadata as md, sys
found = md.version("tensorflow-cpu")
assert found == sys.argv[1], f"tensorflow-cpu {found} installed, {sys.argv[1]} asked"
print("tf-venv:", ", ".join(f"{n} {md.version(n)}" for n in ("tensorflow-cpu", "keras", "numpy", "tf-keras")))
PY
echo "$stamp_text" >"$stamp"
echo "tf-venv: built in $((SECONDS - start)) s ($(du -sh "$prefix" | cut -f1))" >&2
echo "$prefix"
