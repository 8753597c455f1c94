# shellcheck shell=bash
# Settings of the Slurm 24.11 test cluster (tests/cluster/slurm24/up.sh); sourced, not run.
S24_STATE=${HPCMESH_SLURM24_STATE:-/var/lib/hpcmesh-slurm24}
S24_ROOT=${HPCMESH_SLURM24_ROOT:-/var/lib/hpcmesh-slurm24-root}   # the Debian 13 root
S24_VENV=$S24_STATE/venv                      # Python 3.13 venv used inside the root
S24_CLUSTER=hpcm2411
# The same node names, partitions, CPUs, memory and fake GPUs as the 22.05 cluster, so the
# same end-to-end tests run against both; each slurmd has its own UTS namespace (hostname
# nodeK), all listen on 127.0.0.1
S24_NODES=3
S24_NODE_PREFIX=node
S24_CTLD_PORT=7817                            # slurmd ports follow: 7818, 7819, 7820
S24_FAKE_GPUS=2
S24_GPU_DEV=/dev/hpcm24-fakegpu               # /dev/hpcm24-fakegpu0, 1
S24_MUNGE_SOCKET=$S24_STATE/munge/munge.socket

s24() {  # run a command inside the root (e.g. `s24 sinfo`)
    chroot "$S24_ROOT" /usr/bin/env SLURM_CONF=/etc/slurm/slurm.conf "$@"
}

s24_healthy() {  # prints the reason and fails unless every node is idle (or busy)
    [[ -x $S24_ROOT/usr/bin/sinfo ]] || { echo "no root at $S24_ROOT"; return 1; }
    mountpoint -q "$S24_ROOT/proc" || { echo "root not mounted"; return 1; }
    local out
    out=$(timeout 10 chroot "$S24_ROOT" sinfo -h -N -o '%N %t' 2>&1) || { echo "sinfo: $out"; return 1; }
    local n; n=$(awk '$2 ~ /^(idle|alloc|mix|comp|plnd)$/' <<<"$out" | sort -u -k1,1 | wc -l)
    ((n == S24_NODES)) || { echo "nodes not usable: $out"; return 1; }
}
