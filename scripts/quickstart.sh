#!/usr/bin/env bash
# Set up a venv (core + dev extras, no torch) and run the quickstart on this host. No Slurm needed.
set -euo pipefail
cd "$(dirname "$0")/.."
HPCMESH_EXTRAS=dev bash scripts/venv.sh
exec .venv/bin/python examples/quickstart.py
