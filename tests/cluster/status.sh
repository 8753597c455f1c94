#!/usr/bin/env bash
# Exit 0 iff the hpcmesh Slurm test cluster is healthy: munge works, slurmctld
# is alive and answering, and every test node has its namespace, a live slurmd
# and a Slurm state of idle/alloc/mix/comp.  -q: no output.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"
quiet=0
[[ "${1:-}" == "-q" ]] && quiet=1
if reason=$(hpcm_healthy); then
    ((quiet)) || echo "hpcmesh test cluster: healthy ($(hpcm_nodes_count) nodes)"
    exit 0
fi
((quiet)) || echo "hpcmesh test cluster: NOT healthy: $reason (start with: sudo tests/cluster/up.sh)" >&2
exit 1
