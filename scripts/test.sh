#!/usr/bin/env bash
# Set up everything and run the whole test suite: Debian packages, venv, the Slurm test
# cluster (needs root: it installs Debian's packages and makes network namespaces), pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
as_root bash scripts/system-packages.sh
bash scripts/venv.sh
as_root bash tests/cluster/up.sh
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
# pytest's 5 means "no tests collected": that is a failure for us, not a pass.
exit $rc
