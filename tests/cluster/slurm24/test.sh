#!/usr/bin/env bash
# Run the Slurm end-to-end tests against the 24.11 cluster, inside its Debian 13 root, with
# the root's Python 3.13 venv: the same test files the 22.05 cluster runs (SlurmJob from the
# login node, queue waits, requeue, salloc adoption, the client in the allocation, submitit,
# hosts_from_config). Brings the cluster up first if it is not. Arguments replace the
# default list of test files (pytest arguments).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"
[[ $(id -u) -eq 0 ]] || { echo "[slurm24 test] must run as root" >&2; exit 1; }
SLURM24_TESTS=(tests/test_slurm_e2e.py tests/test_slurm_queue.py tests/test_submitit_job.py
               tests/test_hosts_from_config.py)
if (($#)); then args=("$@"); else args=("${SLURM24_TESTS[@]}"); fi
bash "$HERE/up.sh"
# HPCMESH_IFNAME=lo: every node of this cluster is 127.0.0.1, and so is its traffic
exec chroot "$S24_ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
    PATH="$S24_VENV/bin:/usr/sbin:/usr/bin:/sbin:/bin" CI="${CI:-}" \
    HPCMESH_TEST_SLURM=24.11 HPCMESH_IFNAME=lo \
    bash -c 'cd "$0" && exec python -m pytest -q -p no:cacheprovider "$@"' "$REPO" \
    "${args[@]}"
