# shellcheck shell=bash
# A Debian root in a folder, made with debootstrap, for running things on another Debian
# release (or on a bare one) beside this machine. Sourced by scripts/fresh-check.sh and
# tests/cluster/slurm2411/up.sh; not meant to be run. Needs root.
#
#   droot_make ROOT SUITE [packages...]   debootstrap --variant=minbase (once; reused after)
#   droot_mount ROOT                      proc, /sys and /dev (rslave), a private /run tmpfs
#   droot_umount ROOT                     everything under ROOT, deepest first
#   droot_kill ROOT                       every process whose root directory is ROOT
#   droot_remove ROOT                     kill, unmount, delete
#
# The root gets this machine's apt sources and pip configuration (the same registries as
# the host: Debian's mirror, PyPI and the wheels that lie on this machine's disk), so what
# installs inside it installs the way it would on a new machine of this kind.

droot_log() { echo "[debian-root] $*" >&2; }

droot_mirror() {  # the Debian mirror this machine's apt uses
    local uri
    uri=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' |
          grep -v security | head -n1)
    [[ -n $uri ]] || uri=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | head -n1)
    echo "${uri:-http://deb.debian.org/debian}"
}

droot_need_debootstrap() {
    command -v debootstrap >/dev/null 2>&1 && return 0
    droot_log "installing debootstrap"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q debootstrap >/dev/null 2>&1 || {
        apt-get update -q >/dev/null && apt-get install -y -q debootstrap >/dev/null; }
}

droot_make() {
    local root=$1 suite=$2; shift 2
    local mirror; mirror=$(droot_mirror)
    if [[ ! -x $root/usr/bin/apt-get || ! -f $root/.debian-root-complete ]]; then
        droot_need_debootstrap
        droot_remove "$root" || return 1       # never rm -rf through a mount of the host
        mkdir -p "$root"
        droot_log "debootstrap --variant=minbase $suite $root $mirror"
        debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$root.debootstrap.log" 2>&1 || {
            tail -n 20 "$root.debootstrap.log" >&2; return 1; }
        printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
            "$mirror" "$suite" "$suite" >"$root/etc/apt/sources.list.d/debian.sources"
        : >"$root/etc/apt/sources.list"
        touch "$root/.debian-root-complete"
    fi
    cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    # this machine's name resolves inside (munged looks it up)
    grep -qw "$(hostname)" "$root/etc/hosts" 2>/dev/null ||
        printf '127.0.0.1 localhost\n127.0.1.1 %s\n' "$(hostname)" >>"$root/etc/hosts"
    # this machine's certificate authorities: the registries are reached through them (local
    # ones in /usr/local/share/ca-certificates survive update-ca-certificates in the root)
    mkdir -p "$root/etc/ssl/certs" "$root/usr/local/share/ca-certificates"
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/" 2>/dev/null || true
    cp -a /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
    # pip: the same indexes and on-disk wheels as this machine (bind-mounted read-only)
    local f
    for f in /etc/pip.conf /etc/xdg/pip /root/.config/pip; do
        [[ -e $f ]] || continue
        mkdir -p "$root$(dirname "$f")"
        rm -rf "${root:?}$f"
        cp -a "$f" "$root$f"
    done
    if (($#)); then
        droot_mount "$root"
        droot_log "apt-get install $*"
        chroot "$root" /usr/bin/env DEBIAN_FRONTEND=noninteractive bash -c \
            'apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "$@" >/dev/null' \
            _ "$@"
    fi
}

droot_mounted() { mountpoint -q "$1"; }

droot_mount() {
    local root=$1 d
    # the root a mount point of its own: `unshare --mount` (ip netns exec, the Slurm lab's
    # node namespaces) makes / rslave, which fails on a plain folder under chroot
    # private: nothing mounted under it propagates back to the host, or out of a
    # bind of it (the mounts below are made slaves of the host's, not peers)
    droot_mounted "$root" || { mount --bind "$root" "$root" && mount --make-rprivate "$root"; }
    droot_mounted "$root/proc" || mount -t proc proc "$root/proc"
    for d in sys dev; do
        droot_mounted "$root/$d" || { mount --rbind "/$d" "$root/$d" && mount --make-rslave "$root/$d"; }
    done
    droot_mounted "$root/run" || mount -t tmpfs -o mode=0755 tmpfs "$root/run"
    for d in /opt/wheels /opt/pypi /opt/pypi-more; do
        [[ -d $d ]] || continue
        mkdir -p "$root$d"
        droot_mounted "$root$d" || mount --bind -o ro "$d" "$root$d"
    done
}

droot_kill() {
    local root; root=$(readlink -f "$1")
    [[ -n $root && $root != / ]] || { droot_log "refusing to kill the processes of '$1'"; return 1; }
    local pids=() p r
    for p in /proc/[0-9]*; do
        r=$(readlink "$p/root" 2>/dev/null) || continue
        [[ $r == "$root" || $r == "$root"/* ]] && pids+=("${p#/proc/}")
    done
    ((${#pids[@]})) || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    sleep 1
    kill -KILL "${pids[@]}" 2>/dev/null || true
}

droot_mounts_under() {  # root -> the mount points at or below it, deepest first
    awk -v r="$1" '$2 == r || index($2, r "/") == 1 {print $2}' /proc/self/mounts | sort -r
}

droot_umount() {
    local root; root=$(readlink -f "$1")
    [[ -n $root && $root != / ]] || return 1
    local m pass
    # deepest first; lazy as a last resort (a busy /dev/pts under an rbind); again until
    # none is left (unmounting one can uncover another mounted beneath it)
    for pass in 1 2 3 4 5; do
        [[ -n $(droot_mounts_under "$root") ]] || return 0
        while read -r m; do
            umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
        done < <(droot_mounts_under "$root")
    done
    [[ -z $(droot_mounts_under "$root") ]]
}

droot_remove() {
    local root=$1
    [[ -d $root ]] || { rm -f "$root.debootstrap.log"; return 0; }
    droot_kill "$root" || return 1
    droot_umount "$root" || true
    if [[ -n $(droot_mounts_under "$(readlink -f "$root")") ]]; then
        droot_log "still mounted under $root; not deleting it: $(droot_mounts_under "$(readlink -f "$root")" | tr '\n' ' ')"
        return 1
    fi
    rm -rf --one-file-system "$root" "$root.debootstrap.log"
}
