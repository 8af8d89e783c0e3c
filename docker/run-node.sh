#!/usr/bin/env bash
# One node of a multi-node prores job: one container with every GPU of this node.
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash docker/run-node.sh IMAGE train CONFIG --run-dir /shared/run
# Host networking (NCCL needs the nodes' real interfaces), host IPC and a large /dev/shm (NCCL and
# dataloader shared memory), no memlock limit (RDMA). The current directory is mounted at /workspace:
# keep configs, data and the run directory there, on a file system all nodes share.
set -euo pipefail
image=${1:?usage: run-node.sh IMAGE prores-args...}
shift
: "${NNODES:?set NNODES}" "${NODE_RANK:?set NODE_RANK}" "${MASTER_ADDR:?set MASTER_ADDR}"
exec "${DOCKER:-docker}" run --rm --gpus all --network=host --ipc=host --shm-size="${SHM_SIZE:-64g}" \
  --ulimit memlock=-1 --ulimit stack=67108864 \
  -e NNODES -e NODE_RANK -e MASTER_ADDR -e MASTER_PORT="${MASTER_PORT:-29500}" -e GPUS_PER_NODE \
  -e NCCL_SOCKET_IFNAME -e NCCL_IB_HCA -e NCCL_DEBUG \
  -v "$PWD:/workspace" -w /workspace "$image" "$@"
