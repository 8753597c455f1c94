#!/usr/bin/env bash
# The mission's shape on a 32-node test cluster (issue 30): bring the cluster up with 32
# nodes (every node a network namespace of this machine, ~6 MB each), run
# check_mission_shape.py, then put the 3-node cluster back for whatever runs next.
# Needs root, as tests/cluster/up.sh does.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
cd "$REPO"
restore() { bash tests/cluster/down.sh >/dev/null 2>&1; bash tests/cluster/up.sh >/dev/null; }
trap restore EXIT
bash tests/cluster/down.sh >/dev/null 2>&1
HPCMESH_TEST_NODES=32 bash tests/cluster/up.sh || exit 1
.venv/bin/python -m pytest -q -p no:cacheprovider -s tests/cluster/scale32/check_mission_shape.py "$@"
