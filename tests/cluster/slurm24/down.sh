#!/usr/bin/env bash
# Stop the Slurm 24.11 test cluster and delete its root (tests/cluster/slurm24/up.sh).
# Idempotent. KEEP_ROOT=1 keeps the debootstrapped root for the next up.sh (saves ~30 s).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
# shellcheck source=../../../scripts/lib/debian-root.sh
source "$REPO/scripts/lib/debian-root.sh"
# shellcheck source=common.sh
source "$HERE/common.sh"
[[ $(id -u) -eq 0 ]] || { echo "[slurm24 down] must run as root" >&2; exit 1; }
[[ -d $S24_ROOT ]] || exit 0
if [[ -x $S24_ROOT/usr/bin/squeue ]] && mountpoint -q "$S24_ROOT/proc"; then
    jobs=$(timeout 5 chroot "$S24_ROOT" squeue -h -o %i 2>/dev/null || true)
    # shellcheck disable=SC2086
    [[ -z $jobs ]] || timeout 10 chroot "$S24_ROOT" scancel $jobs 2>/dev/null || true
fi
droot_kill "$S24_ROOT"        # slurmctld, the slurmd, munged, and any job left
# job processes live in the slurmd's freezer cgroups, which outlive them briefly
for cg in /sys/fs/cgroup/freezer/slurm_${S24_NODE_PREFIX}*; do
    [[ -d $cg ]] && find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
done
rm -f "$S24_GPU_DEV"[0-9]*
if [[ ${KEEP_ROOT:-0} == 1 ]]; then
    droot_umount "$S24_ROOT"
    rm -rf "${S24_STATE:?}"/{ctld,spool,log,munge,repo,*.pid}
else
    droot_remove "$S24_ROOT"
    rm -rf "${S24_STATE:?}"
fi
echo "[slurm24 down] done"
