#!/usr/bin/env bash
# The container's entrypoint: `prores ARGS` on one node (`prores train` as one process a visible GPU, under
# torchrun; GPUS_PER_NODE overrides the count), or one node of a multi-node job.
#
# Multi-node (one container per node, no ssh): set NNODES > 1, NODE_RANK, MASTER_ADDR (node 0's
# address), and optionally MASTER_PORT (29500) and GPUS_PER_NODE (all visible GPUs). Each node
# starts its own workers with `deepspeed --no_ssh --node_rank`; they meet at MASTER_ADDR:MASTER_PORT.
set -euo pipefail
NNODES=${NNODES:-1}
gpus() { python -c "import torch; print(torch.cuda.device_count())"; }
if [ "$NNODES" -le 1 ]; then
  # one node: `prores train` gets one process a GPU (torchrun), every other command runs once
  if [ "${1:-}" = train ]; then
    GPUS_PER_NODE=${GPUS_PER_NODE:-$(gpus)}
    if [ "$GPUS_PER_NODE" -gt 1 ]; then
      exec torchrun --standalone --nproc-per-node "$GPUS_PER_NODE" -m prores "$@"
    fi
  fi
  exec python -m prores "$@"
fi
: "${NODE_RANK:?set NODE_RANK (0..NNODES-1) for a multi-node launch}"
: "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}"
if [ -z "${GPUS_PER_NODE:-}" ]; then
  GPUS_PER_NODE=$(gpus)
  [ "$GPUS_PER_NODE" -ge 1 ] || GPUS_PER_NODE=1
fi
# --no_ssh takes the world's shape from a hostfile; its host names are never contacted.
hostfile=$(mktemp)
for i in $(seq 0 $((NNODES - 1))); do echo "node$i slots=$GPUS_PER_NODE"; done > "$hostfile"
exec deepspeed --hostfile "$hostfile" --no_ssh --node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" \
  --master_port "${MASTER_PORT:-29500}" --module prores "$@"
