#!/usr/bin/env bash
# hpcmesh's NCCL path on this machine's NVIDIA GPUs (one process per GPU): PASS/FAIL per
# check and the all_reduce bus bandwidth; the checks are in benchmarks/gpu_check.py.
#
#   benchmarks/gpu_check.sh                          # from a bare machine: builds .venv-gpu
#   PYTHON=/path/to/python benchmarks/gpu_check.sh   # a python that has CUDA torch already
#   benchmarks/gpu_check.sh --mib 1024 --iters 20    # arguments go to gpu_check.py
#
# Exit status: 0 all PASS, 1 a FAIL (or no usable CUDA torch), 2 no NVIDIA GPU.
# .venv is not used: constraints.txt pins the CPU wheel there. .venv-gpu gets torch from
# the default index (a CUDA build on Linux x86_64; a ~3 GB download the first time).
set -euo pipefail
cd "$(dirname "$0")/.."

ngpu=0
if command -v nvidia-smi >/dev/null 2>&1; then
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
if [ "${ngpu:-0}" -lt 1 ]; then
  echo "gpu_check: no NVIDIA GPU found (nvidia-smi $(command -v nvidia-smi >/dev/null && echo 'lists none' || echo 'not installed')); nothing to check" >&2
  exit 2
fi
echo "gpu_check: nvidia-smi lists $ngpu GPU(s)"

cuda_ok='import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
  # hpcmesh from this tree if that python lacks it (its three small dependencies must be there)
  "$PY" -c 'import hpcmesh' 2>/dev/null || export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  PY=.venv-gpu/bin/python
  if [ ! -x "$PY" ]; then
    base=$(command -v python3.11 || command -v python3)
    "$base" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' ||
      { echo "gpu_check: hpcmesh needs Python >= 3.11 ($base is older); pass PYTHON=" >&2; exit 1; }
    if ! "$base" -c 'import venv, ensurepip' 2>/dev/null; then
      if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-venv
      else sudo apt-get update -qq && sudo apt-get install -y -qq --no-install-recommends python3-venv; fi
    fi
    "$base" -m venv .venv-gpu
  fi
  if ! "$PY" -c "$cuda_ok" 2>/dev/null; then
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q torch numpy            # default index: the CUDA build
  fi
  "$PY" -c 'import hpcmesh' 2>/dev/null || "$PY" -m pip install -q -e .
fi
if ! "$PY" -c "$cuda_ok" 2>/dev/null; then
  echo "gpu_check: FAIL: $PY has no usable CUDA torch: $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1)" >&2
  exit 1
fi
# the checks take about a minute; a hang must not hold the machine
exec timeout 480 "$PY" benchmarks/gpu_check.py "$@"
