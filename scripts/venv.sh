#!/usr/bin/env bash
# Create (or update) .venv with hpcmesh and everything the tests use.
# Works on a fresh Debian 12 machine; torch is pinned by constraints.txt for tests only.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import venv, ensurepip' 2>/dev/null; then
  # python3-venv alone: the venv brings its own pip (pip's recommends would add a compiler)
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-venv
  else sudo apt-get update -qq && sudo apt-get install -y -qq --no-install-recommends python3-venv; fi
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
extras=${HPCMESH_EXTRAS:-all}
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -c constraints.txt -e ".[$extras]"
