#!/usr/bin/env bash
# Start a prores job on N bare nodes over ssh from this machine: one container per node.
#   bash docker/launch.sh IMAGE "node1 node2 node3" train configs/depth/120.yaml --run-dir runs/d120
# Node 0 (the first host) is the rendezvous. Every node must reach it on MASTER_PORT (default 29500),
# have docker with the NVIDIA runtime, the image, and this directory at the same path (shared FS).
set -euo pipefail
image=${1:?usage: launch.sh IMAGE "HOST..." prores-args...}
read -r -a hosts <<< "${2:?give the hosts, node 0 first}"
shift 2
n=${#hosts[@]}
pids=()
for i in "${!hosts[@]}"; do
  ssh "${hosts[$i]}" "cd $(printf %q "$PWD") && NNODES=$n NODE_RANK=$i MASTER_ADDR=${hosts[0]}" \
    "MASTER_PORT=${MASTER_PORT:-29500} bash docker/run-node.sh $(printf '%q ' "$image" "$@")" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"
