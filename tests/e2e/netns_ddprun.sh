#!/usr/bin/env bash
# Two nodes on one machine (two network namespaces joined by a veth pair): one
# `ddprun --nnodes 2` agent in each, NPROC CPU ranks per node over gloo (what
# `auto` picks across nodes), training the MLP on the synthetic set. The trained
# parameters (and momentum buffers) must equal those of `ddprun -n 2*NPROC` on
# one node (shm) with the same flags: byte-identical or within 1e-5 relative.
#
# usage: netns_ddprun.sh DDPRUN TRAIN NPROC
# Exit 77 when namespaces cannot be made (see lib_netns.sh).
# NETNS_NODE1_ARGS: extra train flags for node 1 only (e.g. "--lr 0.06"), to
# check that the comparison fails when the nodes disagree.
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/e2e/lib_netns.sh
. "$here/lib_netns.sh"
ddprun=$1 train=$2 nproc=$3
world=$((2 * nproc))
netns_up

args=(--data synthetic --synthetic-size 1024 --epochs 2 --max-steps 6 --batch-size 16
      --lr-schedule constant --lr 0.05 --seed 7 --device cpu --quiet)
export DDP_STORE_SECRET="netns-$RANDOM$RANDOM" DDP_TIMEOUT_S=60 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

# Reference: the same global batch on one node (shm).
"$ddprun" --standalone -n "$world" --grace-period 2 "$train" "${args[@]}" --save "$WORK/one_node.safetensors" \
  >"$WORK/one_node.log" 2>&1 || fail "one-node run exited $?"

port=$(free_port)
common=(--nnodes 2 -n "$nproc" --master-addr "$IP0" --master-port "$port" --grace-period 2 --rdzv-timeout 30)
# DDP_LOG_LEVEL=debug: the ranks log the backend the bootstrap chose.
# timeout: the agents must not outlive the test (ctest's TIMEOUT would kill only this shell).
# shellcheck disable=SC2086  # NETNS_NODE1_ARGS: several flags
DDP_LOG_LEVEL=debug timeout -k 5 100 ip netns exec "$NS1" "$ddprun" "${common[@]}" --node-rank 1 "$train" "${args[@]}" \
  ${NETNS_NODE1_ARGS:-} --save "$WORK/node1_unused.safetensors" >"$WORK/node1.log" 2>&1 &
node1=$!
DDP_LOG_LEVEL=debug timeout -k 5 100 ip netns exec "$NS0" "$ddprun" "${common[@]}" --node-rank 0 "$train" "${args[@]}" \
  --save "$WORK/two_nodes.safetensors" --metrics "$WORK/metrics.jsonl" >"$WORK/node0.log" 2>&1 &
node0=$!
wait $node0 || fail "node 0 exited $?"
wait $node1 || fail "node 1 exited $?"

for r in $(seq 0 $((world - 1))); do
  log="$WORK/node$((r / nproc)).log"
  grep -q "^\[rank $r\] .*process group: backend gloo rank $r/$world on cpu" "$log" ||
    fail "rank $r did not use the gloo backend across nodes"
done
[ -f "$WORK/node1_unused.safetensors" ] && fail "node 1 wrote a checkpoint (only rank 0 saves)"
grep -q "\"world_size\": $world" "$WORK/metrics.jsonl" || fail "metrics lack world_size $world"
expect_same_as_one_node netns_ddprun "$world" "2 nodes x $nproc ranks (gloo)"
