#!/usr/bin/env bash
# Tear down the hpcmesh Slurm test cluster built by tests/cluster/up.sh.
# Idempotent: safe to run when nothing (or only part of it) is up.
# Keeps: installed packages, logs in /var/log/slurm (incl. jobcomp.log).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"

log() { echo "[down] $*"; }
[[ $(id -u) -eq 0 ]] || { echo "[down] must run as root" >&2; exit 1; }

# Nodes to clean: everything matching our naming, whatever N was.
mapfile -t NSES < <(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^hpcm-node[0-9]+$' || true)
mapfile -t CGS < <(find "$HPCM_FREEZER" "$HPCM_MEMCG" -maxdepth 1 -mindepth 1 -type d -name 'hpcm-node*' 2>/dev/null || true)
mapfile -t PIDFILES < <(ls /run/slurmd-node*.pid 2>/dev/null || true)

# 1. cancel all jobs while the controller is still there
if command -v squeue >/dev/null 2>&1 && timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP'; then
    jobs=$(squeue -h -o %i 2>/dev/null || true)
    if [[ -n $jobs ]]; then
        log "cancelling jobs: $(echo $jobs)"
        # shellcheck disable=SC2086
        scancel $jobs 2>/dev/null || true
        for _ in $(seq 50); do [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break; sleep 0.2; done
    fi
fi

kill_wait() {  # pid... : TERM, wait up to 5 s, KILL
    local p alive
    (($#)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    for _ in $(seq 50); do
        alive=0
        for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
        ((alive)) || return 0
        sleep 0.1
    done
    kill -KILL "$@" 2>/dev/null || true
}

# 2. slurm daemons, then anything still living in the nodes' cgroups/netns
pids=()
for f in "${PIDFILES[@]}"; do
    [[ -n $f ]] || continue
    hpcm_pid_alive "$f" && pids+=("$(cat "$f")")
done
# slurmctld stops in parallel with the slurmds (each takes ~2 s to shut down)
if hpcm_pid_alive "$HPCM_CTLD_PID"; then
    log "stopping slurmctld ($(cat "$HPCM_CTLD_PID"))"
    pids+=("$(cat "$HPCM_CTLD_PID")")
fi
if ((${#pids[@]})); then
    log "stopping slurm daemons (${pids[*]})"
    kill_wait "${pids[@]}"
fi
for f in "${PIDFILES[@]}"; do [[ -n $f ]] && rm -f "$f"; done
leftover=()
for cg in "${CGS[@]}"; do
    [[ -n $cg ]] || continue
    while read -r p; do leftover+=("$p"); done < <(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null)
done
for ns in "${NSES[@]}"; do
    [[ -n $ns ]] || continue
    while read -r p; do leftover+=("$p"); done < <(ip netns pids "$ns" 2>/dev/null)
done
if ((${#leftover[@]})); then
    log "killing leftover node processes: ${leftover[*]}"
    kill_wait "${leftover[@]}"
fi
for cg in "${CGS[@]}"; do
    [[ -n $cg ]] || continue
    find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [[ -d $cg ]] && log "WARNING: could not remove cgroup $cg"
done

rm -f "$HPCM_CTLD_PID"

# 3. munged, only if up.sh started it
if [[ $(hpcm_manifest_get started_munged) == 1 ]] && [[ -s /run/munge/munged.pid ]]; then
    log "stopping munged"
    kill_wait "$(cat /run/munge/munged.pid)"
fi

# 4. network
for ns in "${NSES[@]}"; do
    [[ -n $ns ]] || continue
    ip netns delete "$ns" 2>/dev/null || true
done
for v in $(ip -o link show 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print $2}'); do
    [[ $v =~ ^hpcm-v[0-9]+$ ]] && { ip link delete "$v" 2>/dev/null || true; }
done
if ip link show "$HPCM_BRIDGE" >/dev/null 2>&1; then
    log "removing bridge $HPCM_BRIDGE and ${#NSES[@]} node namespaces"
    ip link delete "$HPCM_BRIDGE"
fi

# 5. /etc/hosts block
if grep -qxF -e "$HPCM_HOSTS_BEGIN" -e "$HPCM_HOSTS_END" /etc/hosts; then
    tmp=$(mktemp)
    hpcm_strip_hosts_block </etc/hosts >"$tmp"
    cat "$tmp" >/etc/hosts
    rm -f "$tmp"
fi

# 6. generated files (only ours: configs carry a marker line)
for f in slurm.conf cgroup.conf gres.conf; do
    p=$HPCM_SLURM_ETC/$f
    if [[ -f $p ]] && grep -qF "$HPCM_CONF_MARK" "$p"; then
        rm -f "$p"
        if [[ -f $HPCM_STATE_DIR/$f.orig ]]; then
            mv "$HPCM_STATE_DIR/$f.orig" "$p"
            log "restored original $p"
        fi
    fi
done
rm -f /dev/hpcm-fakegpu[0-9]*
rm -rf /var/spool/slurmd/node[0-9]* "$HPCM_CTLD_STATE"
if [[ -d $HPCM_STATE_DIR ]]; then
    rm -f "$HPCM_STATE_DIR"/hosts.node* "$HPCM_STATE_DIR/resolv.conf" "$HPCM_MANIFEST"
    rmdir "$HPCM_STATE_DIR" 2>/dev/null || true
fi
log "cluster is down"
