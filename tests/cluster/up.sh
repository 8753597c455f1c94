#!/usr/bin/env bash
# Bring up the hpcmesh multi-node Slurm test cluster on this machine.
# Each compute node is a network namespace (+ private mount/UTS/cgroup
# namespaces for its slurmd). See tests/cluster/README.md.
#
#   sudo tests/cluster/up.sh            # default 3 nodes
#   HPCMESH_TEST_NODES=4 sudo tests/cluster/up.sh
#   tests/cluster/up.sh --check         # same as status.sh
#
# Idempotent: if the cluster is already up and healthy it says so and exits 0;
# a partial/broken cluster is torn down (down.sh) and rebuilt.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"

log() { echo "[up] $*"; }
die() { echo "[up] ERROR: $*" >&2; exit 1; }

# --------------------------------------------------------------------------
# Internal: runs inside the node's fresh mount/UTS/cgroup namespaces (and its
# network namespace) and execs slurmd there. Called by start_slurmd below.
# --------------------------------------------------------------------------
if [[ "${1:-}" == "__node_init" ]]; then
    k=$2
    node=node$k
    hostname "$node"
    # per-node name resolution; the mount ns is private so this doesn't leak
    mount --bind "$HPCM_STATE_DIR/hosts.$node" /etc/hosts
    # the host's DNS server is unreachable from the private /24: without this,
    # lookups that fall through to DNS (e.g. `getent hosts X`, which asks for
    # AAAA first) hang 10 s; 127.0.0.1 fails fast and keeps packets local
    mount --bind "$HPCM_STATE_DIR/resolv.conf" /etc/resolv.conf
    # re-mount the freezer hierarchy from inside the cgroup namespace so this
    # slurmd sees $HPCM_FREEZER/hpcm-nodeK as its root: every node gets its
    # own cgroup tree (Debian's slurmd already uses slurm_<node>/ prefixes, but
    # this also keeps all of a node's processes under hpcm-nodeK for down.sh)
    # (mounting over the inherited mount is refused: unmount it first)
    umount "$HPCM_FREEZER"
    mount -t cgroup -o rw,relatime,freezer cgroup "$HPCM_FREEZER"
    [[ ! -d $HPCM_FREEZER/hpcm-node$k ]] || { echo "freezer view not namespaced" >&2; exit 1; }
    # the same for the memory hierarchy, so that task/cgroup's ConstrainRAMSpace
    # limits a job step to its --mem and Slurm reports OUT_OF_MEMORY for real
    umount "$HPCM_MEMCG"
    mount -t cgroup -o rw,relatime,memory cgroup "$HPCM_MEMCG"
    [[ ! -d $HPCM_MEMCG/hpcm-node$k ]] || { echo "memory cgroup view not namespaced" >&2; exit 1; }
    exec slurmd -N "$node"
fi

if [[ "${1:-}" == "--check" ]]; then
    exec "$HERE/status.sh"
fi
[[ $# -eq 0 ]] || die "usage: $0 [--check]"
[[ $(id -u) -eq 0 ]] || die "must run as root"

N=${HPCMESH_TEST_NODES:-3}
[[ $N =~ ^[0-9]+$ && $N -ge 1 && $N -le 200 ]] || die "HPCMESH_TEST_NODES must be 1..200 (got '$N')"
export HPCMESH_TEST_NODES=$N
LOGIN_HOST=$(hostname)
T0=$(date +%s%N)

# --------------------------------------------------------------------------
# 0. already up?
# --------------------------------------------------------------------------
built_n=$(hpcm_manifest_get nodes)
if [[ -n $built_n && $built_n != "$N" ]]; then
    reason="running with $built_n nodes, $N requested"
elif command -v sinfo >/dev/null 2>&1 && [[ -f $HPCM_MANIFEST ]] && reason=$(hpcm_healthy); then
    log "cluster '$HPCM_CLUSTER_NAME' already up and healthy ($N nodes); nothing to do."
    sinfo
    log "stop it with: tests/cluster/down.sh"
    exit 0
fi
if [[ -f $HPCM_MANIFEST ]] || ip link show "$HPCM_BRIDGE" >/dev/null 2>&1; then
    log "cluster present but needs a rebuild (${reason:-?}); tearing down first"
    "$HERE/down.sh"
fi

# --------------------------------------------------------------------------
# 1. packages
# --------------------------------------------------------------------------
# openssl: the TLS tests make their certificates with the openssl command
PKGS=(slurmctld slurmd slurm-client munge iproute2 openssl)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q "${missing[@]}"; then
        apt-get update -q
        apt-get install -y -q "${missing[@]}"
    fi
fi
for b in slurmctld slurmd sinfo munged nsenter unshare ip; do
    command -v "$b" >/dev/null || die "$b not found after install"
done

mkdir -p "$HPCM_STATE_DIR"
: >"$HPCM_MANIFEST"
manifest() { echo "$1=$2" >>"$HPCM_MANIFEST"; }
manifest nodes "$N"
manifest login_host "$LOGIN_HOST"

# --------------------------------------------------------------------------
# 2. munge
# --------------------------------------------------------------------------
if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating munge key"
    install -d -o munge -g munge -m 0700 /etc/munge
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    manifest created_munge_key 1
fi
if ! hpcm_munge_ok; then
    log "starting munged"
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    runuser -u munge -- /usr/sbin/munged
    manifest started_munged 1
    for _ in $(seq 50); do hpcm_munge_ok && break; sleep 0.1; done
    hpcm_munge_ok || die "munged does not work (see /var/log/munge/munged.log)"
fi

# --------------------------------------------------------------------------
# 3. network: bridge + one namespace/veth per node
# --------------------------------------------------------------------------
[[ $(cat /proc/sys/net/ipv4/ip_forward) == 0 ]] ||
    log "WARNING: net.ipv4.ip_forward=1 here; node namespaces could route beyond the bridge"
ip link add "$HPCM_BRIDGE" type bridge
ip addr add "$HPCM_LOGIN_ADDR/24" dev "$HPCM_BRIDGE"
ip link set "$HPCM_BRIDGE" up
manifest bridge "$HPCM_BRIDGE"
for ((k = 1; k <= N; k++)); do
    ns=$(hpcm_node_ns "$k")
    ip netns add "$ns"
    ip link add "hpcm-v$k" type veth peer name eth0 netns "$ns"
    ip link set "hpcm-v$k" master "$HPCM_BRIDGE" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$(hpcm_node_addr "$k")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route add default via "$HPCM_LOGIN_ADDR"
    manifest netns "$ns"
done

# --------------------------------------------------------------------------
# 4. name resolution
# --------------------------------------------------------------------------
node_lines=$(for ((k = 1; k <= N; k++)); do echo "$(hpcm_node_addr "$k") node$k"; done)
# localhost must resolve on the login node too (the tests and asyncio's resolver ask for
# it); a machine whose /etc/hosts lacks it gets it inside our block, which down.sh removes
if ! hpcm_strip_hosts_block </etc/hosts | grep -qE '^[[:space:]]*127\.0\.0\.1[[:space:]].*\blocalhost\b'; then
    node_lines=$(printf '127.0.0.1 localhost\n%s' "$node_lines")
fi
# root namespace (= login node): marked block with the compute nodes only
# ($LOGIN_HOST keeps resolving to 127.x here, like on many real login nodes)
tmp=$(mktemp)
hpcm_strip_hosts_block </etc/hosts >"$tmp"
{ echo "$HPCM_HOSTS_BEGIN"; echo "$node_lines"; echo "$HPCM_HOSTS_END"; } >>"$tmp"
cat "$tmp" >/etc/hosts   # rewrite in place (keeps inode; /etc/hosts may be a bind mount)
rm -f "$tmp"
manifest hosts_block 1
printf '%s\nnameserver 127.0.0.1\noptions timeout:1 attempts:1\n' "# $HPCM_CONF_MARK" \
    >"$HPCM_STATE_DIR/resolv.conf"
# per node: bind-mounted over /etc/hosts inside the node's mount namespace
for ((k = 1; k <= N; k++)); do
    {
        echo "# /etc/hosts of node$k ($HPCM_CONF_MARK)"
        echo "127.0.0.1 localhost"
        echo "::1 localhost ip6-localhost ip6-loopback"
        echo "$HPCM_LOGIN_ADDR $LOGIN_HOST hpcm-login"
        echo "$node_lines"
    } >"$HPCM_STATE_DIR/hosts.node$k"
done

# --------------------------------------------------------------------------
# 5. fake GPUs + slurm config
# --------------------------------------------------------------------------
for ((g = 0; g < HPCM_FAKE_GPUS; g++)); do
    dev=/dev/hpcm-fakegpu$g
    [[ -c $dev ]] || { rm -f "$dev"; mknod -m 0666 "$dev" c 60 "$g"; }
    manifest device "$dev"
done

install -d -m 0755 "$HPCM_SLURM_ETC"
for f in slurm.conf cgroup.conf gres.conf; do
    if [[ -e $HPCM_SLURM_ETC/$f ]] && ! grep -qF "$HPCM_CONF_MARK" "$HPCM_SLURM_ETC/$f"; then
        cp -a "$HPCM_SLURM_ETC/$f" "$HPCM_STATE_DIR/$f.orig"
        manifest backup "$f"
        log "existing $HPCM_SLURM_ETC/$f saved to $HPCM_STATE_DIR/$f.orig (restored by down.sh)"
    fi
done
nodelist="node[1-$N]"
((N == 1)) && nodelist=node1

cat >"$HPCM_SLURM_ETC/slurm.conf" <<EOF
$HPCM_CONF_MARK
ClusterName=$HPCM_CLUSTER_NAME
SlurmctldHost=$LOGIN_HOST($HPCM_LOGIN_ADDR)
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
StateSaveLocation=$HPCM_CTLD_STATE
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=$HPCM_CTLD_PID
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=$HPCM_LOG_DIR/slurmctld.log
SlurmdLogFile=$HPCM_LOG_DIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdParameters=config_overrides
# proctrack/cgroup (v1 freezer, per-node cgroup namespace) so that scancel
# also kills daemonized (setsid) children of job tasks
ProctrackType=proctrack/cgroup
# task/cgroup with ConstrainRAMSpace (cgroup.conf): a step that passes its --mem is
# ended by the kernel's OOM killer and Slurm says OUT_OF_MEMORY (issue 31's failure class)
TaskPlugin=task/cgroup
# real preemption: a job of the 'urgent' partition (PriorityTier 10) requeues the
# jobs of debug/batch it needs the nodes of (PreemptMode=REQUEUE), after their
# partition's GraceTime (10 s: SIGTERM to their tasks at once, SIGKILL at its end), as
# sites that let jobs checkpoint do (no preempt_send_user_signal: SIGTERM is the notice)
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SelectType=select/cons_tres
# memory is a consumable resource, so that a step's --mem is its cgroup limit; a job
# that asks for none gets DefMemPerNode (a quarter of a node: as many jobs fit by memory
# as by CPUs)
SelectTypeParameters=CR_Core_Memory
DefMemPerNode=8000
GresTypes=gpu
KillWait=2
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
Waittime=0
JobCompType=jobcomp/filetxt
JobCompLoc=$HPCM_LOG_DIR/jobcomp.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
EOF
for ((k = 1; k <= N; k++)); do
    echo "NodeName=node$k NodeAddr=$(hpcm_node_addr "$k") NodeHostname=node$k CPUs=4 RealMemory=32000 Gres=gpu:$HPCM_FAKE_GPUS State=UNKNOWN"
done >>"$HPCM_SLURM_ETC/slurm.conf"
cat >>"$HPCM_SLURM_ETC/slurm.conf" <<EOF
PartitionName=debug Nodes=$nodelist Default=YES MaxTime=INFINITE State=UP GraceTime=10
PartitionName=batch Nodes=$nodelist Default=NO MaxTime=INFINITE State=UP GraceTime=10
PartitionName=urgent Nodes=$nodelist Default=NO MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
EOF

cat >"$HPCM_SLURM_ETC/cgroup.conf" <<EOF
$HPCM_CONF_MARK
CgroupPlugin=cgroup/v1
CgroupAutomount=no
ConstrainCores=no
ConstrainDevices=no
ConstrainRAMSpace=yes
ConstrainSwapSpace=no
EOF

cat >"$HPCM_SLURM_ETC/gres.conf" <<EOF
$HPCM_CONF_MARK
AutoDetect=off
NodeName=$nodelist Name=gpu File=/dev/hpcm-fakegpu[0-$((HPCM_FAKE_GPUS - 1))]
EOF
chmod 0644 "$HPCM_SLURM_ETC"/{slurm,cgroup,gres}.conf
manifest config slurm.conf
manifest config cgroup.conf
manifest config gres.conf

install -d -o slurm -g slurm -m 0755 "$HPCM_LOG_DIR" "$HPCM_CTLD_STATE"
manifest dir "$HPCM_CTLD_STATE"
for ((k = 1; k <= N; k++)); do
    install -d -m 0755 "/var/spool/slurmd/node$k"
    manifest dir "/var/spool/slurmd/node$k"
done

# --------------------------------------------------------------------------
# 6. daemons
# --------------------------------------------------------------------------
grep -q " $HPCM_FREEZER cgroup .*freezer" /proc/mounts ||
    die "no cgroup v1 freezer hierarchy at $HPCM_FREEZER (needed by proctrack/cgroup)"

log "starting slurmctld"
slurmctld || die "slurmctld failed to start; see $HPCM_LOG_DIR/slurmctld.log"
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.1; done
scontrol ping 2>/dev/null | grep -q 'is UP' || { tail -n 30 "$HPCM_LOG_DIR/slurmctld.log" >&2; die "slurmctld not answering"; }

start_slurmd() {
    local k=$1 ns cg
    ns=$(hpcm_node_ns "$k")
    cg=$HPCM_FREEZER/$ns
    mkdir -p "$cg" "$HPCM_MEMCG/$ns"
    manifest cgroup "$cg"
    manifest memcg "$HPCM_MEMCG/$ns"
    # move a subshell into the node's freezer cgroup, then create the new
    # namespaces from there (cgroup ns root = that cgroup). Note: no
    # `ip netns exec` -- it remounts /sys, which hides the cgroup mounts.
    (
        echo "$BASHPID" >"$cg/cgroup.procs"
        echo "$BASHPID" >"$HPCM_MEMCG/$ns/cgroup.procs"
        exec nsenter --net="/run/netns/$ns" \
            unshare --mount --uts --cgroup --propagation private \
            "$HERE/up.sh" __node_init "$k"
    ) </dev/null >>"$HPCM_LOG_DIR/slurmd-node$k.start.log" 2>&1
}
for ((k = 1; k <= N; k++)); do
    log "starting slurmd node$k in netns $(hpcm_node_ns "$k") ($(hpcm_node_addr "$k"))"
    start_slurmd "$k" || die "slurmd node$k failed to start; see $HPCM_LOG_DIR/slurmd-node$k.log"
done

# --------------------------------------------------------------------------
# 7. wait for all nodes idle
# --------------------------------------------------------------------------
ok=0
for _ in $(seq 300); do
    if reason=$(hpcm_healthy); then ok=1; break; fi
    sleep 0.1
done
if ((!ok)); then
    echo "[up] cluster did not become healthy within 30 s: $reason" >&2
    sinfo -N >&2 || true
    for ((k = 1; k <= N; k++)); do
        echo "----- $HPCM_LOG_DIR/slurmd-node$k.log (tail)" >&2
        tail -n 15 "$HPCM_LOG_DIR/slurmd-node$k.log" >&2 || true
    done
    echo "----- $HPCM_LOG_DIR/slurmctld.log (tail)" >&2
    tail -n 15 "$HPCM_LOG_DIR/slurmctld.log" >&2 || true
    exit 1
fi

T1=$(date +%s%N)
ms=$(((T1 - T0) / 1000000))
log "cluster '$HPCM_CLUSTER_NAME' is up ($((ms / 1000)).$(printf %03d $((ms % 1000))) s)"
echo "  login/slurmctld : $LOGIN_HOST  $HPCM_LOGIN_ADDR  (root namespace, bridge $HPCM_BRIDGE)"
for ((k = 1; k <= N; k++)); do
    echo "  node$k           : $(hpcm_node_addr "$k")  netns $(hpcm_node_ns "$k")  CPUs=4 RealMemory=32000 gpu:$HPCM_FAKE_GPUS"
done
echo "  partitions      : debug (default), batch"
echo "  logs            : $HPCM_LOG_DIR/slurmctld.log, $HPCM_LOG_DIR/slurmd-nodeK.log, $HPCM_LOG_DIR/jobcomp.log"
echo "  shell on a node : tests/cluster/node-exec.sh K [cmd...]"
echo "  health check    : tests/cluster/status.sh"
echo "  stop            : tests/cluster/down.sh"
sinfo
