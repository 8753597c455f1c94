#!/usr/bin/env bash
# Run a command "on" test node K, i.e. in the namespaces of its slurmd
# (network, mount -> its /etc/hosts, UTS -> hostname nodeK, cgroup).
#   tests/cluster/node-exec.sh 2 hostname
#   tests/cluster/node-exec.sh 1            # interactive shell
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"
k=${1:?usage: $0 K [cmd...]}
shift
pidf=$(hpcm_node_pidfile "$k")
hpcm_pid_alive "$pidf" || { echo "slurmd of node$k not running" >&2; exit 1; }
(($#)) || set -- bash -i
exec nsenter -t "$(cat "$pidf")" --net --mount --uts --cgroup -- "$@"
