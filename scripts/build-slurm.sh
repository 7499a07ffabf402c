#!/usr/bin/env bash
# Build a Slurm release from its source tarball, for the sandbox and the version matrix.
#
#   bash scripts/build-slurm.sh TARBALL [PREFIX]
#
# TARBALL is a release tarball (slurm-X.Y.Z.tar.bz2/.xz/.gz: SchedMD's download page, or
# a `git archive` of a release tag with its generated `configure`). When a SHA256SUMS file
# lies beside it, the tarball must match its line there. PREFIX defaults to
# /opt/slurm-X.Y.Z (SLURMTF_SLURM_ROOT changes /opt). The build is configured with
# --enable-multiple-slurmd (several slurmd on one host, as the sandbox runs them), without
# debug symbols and without the plugins the sandbox never loads. A stamp in PREFIX records
# the tarball's checksum: a second call with the same tarball rebuilds nothing.
# The last line printed is PREFIX. Needs root for Debian's build dependencies
# (libmunge-dev; build-essential).
set -euo pipefail

usage() {
    echo "usage: bash scripts/build-slurm.sh TARBALL [PREFIX]" >&2
    echo "HINT: TARBALL is a Slurm release tarball, e.g. ../shared/slurm/slurm-26.05.3.tar.xz" >&2
    exit 2
}
[ $# -ge 1 ] && [ $# -le 2 ] || usage
case "$1" in -h|--help) usage ;; esac

tarball="$(readlink -f -- "$1")"
[ -f "$tarball" ] || { echo "build-slurm: TARBALL=$1 does not exist" >&2; usage; }
name="$(basename -- "$tarball")"
version="$(printf '%s\n' "$name" | sed -nE 's/^slurm-([0-9]+\.[0-9]+\.[0-9]+[^/]*)\.tar(\.(bz2|xz|gz))?$/\1/p')"
if [ -z "$version" ]; then
    echo "build-slurm: TARBALL=$name is not named slurm-X.Y.Z.tar[.bz2|.xz|.gz]" >&2
    echo "HINT: pass the release tarball as downloaded; its name gives the version" >&2
    exit 2
fi
prefix="${2:-${SLURMTF_SLURM_ROOT:-/opt}/slurm-$version}"
jobs="${SLURMTF_BUILD_JOBS:-$(nproc)}"

sum="$(sha256sum -- "$tarball" | cut -d' ' -f1)"
sums="$(dirname -- "$tarball")/SHA256SUMS"
if [ -f "$sums" ]; then
    want="$(awk -v n="$name" '{f=$2; sub(/^\*/, "", f)} f == n {print $1}' "$sums")"
    if [ -z "$want" ]; then
        echo "build-slurm: $sums has no line for $name" >&2
        echo "HINT: add its checksum there, or pass a tarball SHA256SUMS lists" >&2
        exit 1
    fi
    if [ "$want" != "$sum" ]; then
        echo "build-slurm: $name has SHA-256 $sum, $sums says $want" >&2
        echo "HINT: the tarball is damaged or not the release; fetch it again" >&2
        exit 1
    fi
fi

options=(--enable-multiple-slurmd --disable-debug --without-hdf5 --without-rrdtool
         --without-pmix --without-ucx --without-nvml --without-rsmi --without-freeipmi
         --without-lua --without-jwt --without-yaml --without-http-parser --without-json
         --without-selinux --without-bpf --without-dbus --without-ofed --without-netloc
         --disable-pam --disable-x11 --disable-slurmrestd)
stamp_text="$sum ${options[*]}"
stamp="$prefix/.slurmtf-build"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_text" ] && [ -x "$prefix/sbin/slurmctld" ]; then
    echo "build-slurm: $prefix already holds this build of $name" >&2
    echo "$prefix"
    exit 0
fi

missing=()
dpkg -s libmunge-dev >/dev/null 2>&1 || missing+=(libmunge-dev)
command -v make >/dev/null && command -v cc >/dev/null || missing+=(build-essential)
command -v xz >/dev/null || missing+=(xz-utils)
command -v bzip2 >/dev/null || missing+=(bzip2)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "build-slurm: missing ${missing[*]}; installing them needs root" >&2
        echo "HINT: apt-get install ${missing[*]}" >&2
        exit 1
    fi
    echo "build-slurm: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt_get=(apt-get -o DPkg::Lock::Timeout=300 -y -qq --no-install-recommends)
    "${apt_get[@]}" install "${missing[@]}" >/dev/null 2>&1 \
        || { apt-get -o DPkg::Lock::Timeout=300 update -qq && "${apt_get[@]}" install "${missing[@]}" >/dev/null; }
fi

work="$(mktemp -d "${TMPDIR:-/var/tmp}/slurmtf-build-$version.XXXXXX")"
trap 'rm -rf -- "$work"' EXIT
log="$work/build.log"
step() {
    local what="$1"; shift
    local start=$SECONDS
    echo "build-slurm: $what" >&2
    if ! "$@" >>"$log" 2>&1; then
        echo "build-slurm: $what failed; the last lines of the log:" >&2
        tail -n 40 "$log" >&2
        exit 1
    fi
    echo "build-slurm: $what took $((SECONDS - start)) s" >&2
}
step "unpacking $name" tar -xf "$tarball" -C "$work"
src="$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -n 1)"
[ -x "$src/configure" ] || { echo "build-slurm: $name has no configure script" >&2; exit 1; }
rm -rf -- "$prefix"
cd "$src"
step "configure (--prefix=$prefix)" ./configure --prefix="$prefix" --sysconfdir="$prefix/etc" "${options[@]}"
step "make -j$jobs" make -j"$jobs"
step "make install" make -j"$jobs" install
rm -rf -- "$prefix/share/doc" "$prefix/share/man"
echo "$stamp_text" >"$stamp"
echo "build-slurm: $("$prefix/sbin/slurmctld" -V) in $prefix ($(du -sh "$prefix" | cut -f1))" >&2
echo "$prefix"
