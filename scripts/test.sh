#!/usr/bin/env bash
# Set up everything and run the whole test suite: venv, the Slurm test cluster
# (needs root: it installs Debian's slurm packages and makes network namespaces), pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh
if [ "$(id -u)" = 0 ]; then bash tests/cluster/up.sh; else sudo bash tests/cluster/up.sh; fi
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
# pytest's 5 means "no tests collected": that is a failure for us, not a pass.
exit $rc
