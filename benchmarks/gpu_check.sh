#!/usr/bin/env bash
# Everything a lent GPU is for, in one command, offline: the steps and their pass criteria are
# benchmarks/gpu_check.py's (`bash benchmarks/gpu_check.sh --plan` lists them, no GPU needed).
#   bash scripts/gpu_wheels.sh                  # first, where a registry is: the wheels, in .gpu-wheels/
#   bash benchmarks/gpu_check.sh [OUT_DIR]      # on the GPU machine, from the repository root (default gpu_check_out)
# The carried wheels go to a folder of their own (--no-index --no-deps): the machine's torch and triton stay.
# Each step runs in its own process under its own time limit; one that fails does not stop the rest.
# OUT_DIR/summary.json holds every step's figure and verdict, OUT_DIR/gpu_check.txt the table to keep as
# docs/gpu_check.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --plan ]; then
  exec python3 benchmarks/gpu_check.py --plan
fi
out="${1:-gpu_check_out}"
mkdir -p "$out"
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'" || exit 1
site=$(mktemp -d)
if [ -d .gpu-wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .gpu-wheels/*.whl || exit 1
fi
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$site/bin:$PATH"
python3 benchmarks/gpu_check.py "$out"
