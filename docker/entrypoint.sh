#!/usr/bin/env bash
# The container's entrypoint: `prores ARGS` on one node, or one node of a multi-node job.
#
# Multi-node (one container per node, no ssh): set NNODES > 1, NODE_RANK, MASTER_ADDR (node 0's
# address), and optionally MASTER_PORT (29500) and GPUS_PER_NODE (all visible GPUs). Each node
# starts its own workers with `deepspeed --no_ssh --node_rank`; they meet at MASTER_ADDR:MASTER_PORT.
set -euo pipefail
NNODES=${NNODES:-1}
if [ "$NNODES" -le 1 ] && [ -z "${GPUS_PER_NODE:-}" ]; then
  exec python -m prores "$@"
fi
: "${NODE_RANK:?set NODE_RANK (0..NNODES-1) for a multi-node launch}"
: "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}"
if [ -z "${GPUS_PER_NODE:-}" ]; then
  GPUS_PER_NODE=$(python -c "import torch; print(max(torch.cuda.device_count(), 1))")
fi
# --no_ssh takes the world's shape from a hostfile; its host names are never contacted.
hostfile=$(mktemp)
for i in $(seq 0 $((NNODES - 1))); do echo "node$i slots=$GPUS_PER_NODE"; done > "$hostfile"
exec deepspeed --hostfile "$hostfile" --no_ssh --node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" \
  --master_port "${MASTER_PORT:-29500}" --module prores "$@"
