#!/usr/bin/env bash
# Prove the README's two commands work on a bare Debian 12: build a minimal root with
# debootstrap (nothing but Debian's "minbase": no python3, no ssh, no Slurm), copy a clean
# clone of this repository's HEAD into it and run, inside it (chroot),
#
#   1. ./scripts/quickstart.sh
#   2. ./scripts/test.sh            (the README's `sudo ./scripts/test.sh`; we are root)
#
# Anything a test needs that the project's scripts do not install fails here, where on the
# machine CI runs on a package installed by hand would hide it.
#
#   sudo scripts/fresh-check.sh              # both commands (about 10 minutes here)
#   sudo scripts/fresh-check.sh quickstart   # only the first
#   KEEP_ROOT=1 sudo scripts/fresh-check.sh  # leave the root for a look (default: deleted)
#
# The root shares this machine's kernel, so the Slurm test cluster inside it uses the same
# network-namespace and bridge names as the host's: a host cluster that is up is taken
# down first and brought back up afterwards. The root reaches the same package registries
# as this machine (its apt mirror, its pip indexes and the wheels on its disk).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib/debian-root.sh
source "$HERE/lib/debian-root.sh"

[[ $(id -u) -eq 0 ]] || { echo "fresh-check: must run as root (debootstrap, chroot)" >&2; exit 1; }
WHAT=${1:-all}
[[ $WHAT == all || $WHAT == quickstart ]] || { echo "usage: $0 [all|quickstart]" >&2; exit 2; }
ROOT=${FRESH_ROOT:-/var/tmp/hpcmesh-fresh-bookworm}
LOG=${FRESH_LOG:-/var/tmp/hpcmesh-fresh-check.log}
say() { echo "[fresh-check] $*" | tee -a "$LOG" >&2; }
: >"$LOG"

host_cluster_was_up=0
host_slurm24_was_up=0
cleanup() {
    local rc=$?
    # the root's clusters, only where it made them: its down.sh sees this kernel's
    # namespaces, cgroups and /dev, so it must not run against the host's
    if [[ -f $ROOT/var/lib/hpcmesh-testcluster/manifest ]]; then
        chroot "$ROOT" /usr/bin/env bash /work/hpcmesh/tests/cluster/down.sh >>"$LOG" 2>&1 || true
    fi
    if [[ -d $ROOT/var/lib/hpcmesh-slurm24-root ]]; then
        chroot "$ROOT" /usr/bin/env bash /work/hpcmesh/tests/cluster/slurm24/down.sh >>"$LOG" 2>&1 || true
    fi
    if [[ ${KEEP_ROOT:-0} == 1 ]]; then
        droot_kill "$ROOT"; droot_umount "$ROOT"
        say "root kept at $ROOT"
    else
        droot_remove "$ROOT" || say "could not remove $ROOT"
    fi
    if ((host_cluster_was_up)); then
        say "bringing the host's test cluster back up"
        bash "$REPO/tests/cluster/up.sh" >>"$LOG" 2>&1 || say "host cluster did not come back (see $LOG)"
    fi
    if ((host_slurm24_was_up)); then
        say "bringing the host's Slurm 24.11 test cluster back up"
        bash "$REPO/tests/cluster/slurm24/up.sh" >>"$LOG" 2>&1 || say "it did not come back (see $LOG)"
    fi
    exit $rc
}
trap cleanup EXIT

t0=$(date +%s)
# a fresh root every time (a reused one would hide a missing step); droot_remove unmounts
# what a killed earlier run left mounted there, and refuses to delete through a mount
droot_remove "$ROOT" || exit 1
droot_make "$ROOT" bookworm
say "minimal Debian 12 root ready at $ROOT in $(( $(date +%s) - t0 )) s (no python3: $( [[ -e $ROOT/usr/bin/python3 ]] && echo no || echo yes ))"

mkdir -p "$ROOT/work"
git clone -q "$REPO" "$ROOT/work/hpcmesh"
say "clean clone of $(git -C "$REPO" rev-parse --short HEAD) in $ROOT/work/hpcmesh"
droot_mount "$ROOT"

run_in_root() {  # name command... : run in the root, log, report
    local name=$1; shift
    local t=$(date +%s) rc=0
    say "running: $*"
    chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        LANG=C.UTF-8 TERM=dumb CI="${CI:-}" bash -c 'cd /work/hpcmesh && "$@"' _ "$@" \
        >>"$LOG" 2>&1 || rc=$?
    say "$name: exit $rc in $(( $(date +%s) - t )) s"
    return $rc
}

rc=0
run_in_root "command 1 (quickstart)" ./scripts/quickstart.sh || rc=1
grep -E '^\S' "$LOG" | grep -vE '^\[' | tail -n 12 >&2 || true
if [[ $WHAT == all ]]; then
    # the root's cluster makes the same bridge, namespaces and devices in this kernel
    if [[ -f /var/lib/hpcmesh-testcluster/manifest ]] || ip link show hpcm-br0 >/dev/null 2>&1; then
        bash "$REPO/tests/cluster/status.sh" >/dev/null 2>&1 && host_cluster_was_up=1
        say "taking the host's test cluster down (the root's cluster uses the same names)"
        bash "$REPO/tests/cluster/down.sh" >>"$LOG" 2>&1
    fi
    # and the root's Slurm 24.11 cluster takes the same ports as the host's
    if [[ -d /var/lib/hpcmesh-slurm24-root ]]; then
        mountpoint -q /var/lib/hpcmesh-slurm24-root/proc && host_slurm24_was_up=1
        say "taking the host's Slurm 24.11 test cluster down (same ports)"
        KEEP_ROOT=1 bash "$REPO/tests/cluster/slurm24/down.sh" >>"$LOG" 2>&1 || true
    fi
    run_in_root "command 2 (test suite)" ./scripts/test.sh || rc=1
    grep -E '(passed|failed|error)' "$LOG" | tail -n 3 >&2 || true
fi
say "done in $(( $(date +%s) - t0 )) s; full log: $LOG"
exit $rc
