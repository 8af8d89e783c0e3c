#!/usr/bin/env bash
# Two "bare nodes" on this machine, each started the way its container starts (docker/entrypoint.sh:
# deepspeed --no_ssh --node_rank R), one worker each, meeting at 127.0.0.1:PORT.
#   bash tests/two_nodes.sh PORT prores-args...
port=$1
shift
entry="$(dirname "$0")/../docker/entrypoint.sh"
NNODES=2 NODE_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port GPUS_PER_NODE=1 bash "$entry" "$@" &
other=$!
NNODES=2 NODE_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port GPUS_PER_NODE=1 bash "$entry" "$@"
first=$?
wait "$other"
second=$?
exit $((first > second ? first : second))
