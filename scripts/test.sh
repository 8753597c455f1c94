#!/usr/bin/env bash
# Set up everything and run the whole test suite: Debian packages, venv, the Slurm test
# cluster (needs root: it installs Debian's packages and makes network namespaces), pytest;
# then the Slurm end-to-end tests again on a Slurm 24.11 cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
as_root bash scripts/system-packages.sh
bash scripts/venv.sh
as_root bash tests/cluster/up.sh
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
# The same Slurm end-to-end tests against a second release: Slurm 24.11 (Debian 13's) in a
# debootstrapped root beside the 22.05 cluster (tests/cluster/slurm24/; HPCMESH_SLURM24=0
# leaves it out). Only for the whole suite, not when arguments pick tests.
rc24=0
if [ $# -eq 0 ] && [ "${HPCMESH_SLURM24:-1}" != 0 ]; then
    echo "== the Slurm end-to-end tests on Slurm 24.11 =="
    as_root bash tests/cluster/slurm24/test.sh
    rc24=$?
fi
# The mission's shape, 32 hosts x 8 processes, on a 32-node test cluster (one test, about
# a minute; tests/cluster/scale32/; HPCMESH_SCALE32=0 leaves it out). The 3-node cluster is
# put back afterwards.
rc32=0
if [ $# -eq 0 ] && [ "${HPCMESH_SCALE32:-1}" != 0 ]; then
    echo "== the mission's shape on a 32-node test cluster =="
    as_root bash tests/cluster/scale32/test.sh
    rc32=$?
fi
set -e
# pytest's 5 means "no tests collected": that is a failure for us, not a pass.
[ $rc -ne 0 ] && exit $rc
[ $rc24 -ne 0 ] && exit $rc24
exit $rc32
